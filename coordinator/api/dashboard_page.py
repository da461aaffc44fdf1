"""The HTML of ``GET /dashboard``: one self-contained page (inline CSS and JS, charts as
inline SVG; nothing loaded from elsewhere). It polls ``/v1/dashboard`` every few seconds,
with ``Authorization: Bearer <token>`` when the page was opened as
``/dashboard#token=<token>`` (coordinator/api/dashboard.py)."""

from __future__ import annotations

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>HACO — fleet status</title>
<style>
:root{--bg:#0f1419;--panel:#171d24;--line:#263041;--text:#dfe6ee;--dim:#8a97a8;
--ok:#3fb68b;--bad:#ef5b5b;--warn:#e8b339;--accent:#5aa9ff}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--text);
font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
header{display:flex;align-items:center;gap:14px;padding:14px 24px;
border-bottom:1px solid var(--line);background:#121820}
header h1{font-size:18px;margin:0;font-weight:600;letter-spacing:.2px}
header .sub{color:var(--dim);font-size:13px}
#status{margin-left:auto;font-size:12px;padding:3px 10px;border-radius:99px;
background:#22303f;color:var(--dim)}
#status.live{background:rgba(63,182,139,.15);color:var(--ok)}
#status.err{background:rgba(239,91,91,.15);color:var(--bad)}
main{padding:18px 24px;display:grid;gap:16px;
grid-template-columns:repeat(12,1fr);max-width:1500px;margin:0 auto}
.card{background:var(--panel);border:1px solid var(--line);border-radius:10px;padding:14px 16px}
.card h2{font-size:12px;text-transform:uppercase;letter-spacing:.8px;color:var(--dim);
margin:0 0 10px;font-weight:600}
.kpis{grid-column:span 12;display:grid;grid-template-columns:repeat(6,1fr);gap:16px}
.kpi .v{font-size:28px;font-weight:600;font-variant-numeric:tabular-nums}
.kpi .d{color:var(--dim);font-size:12px}
.bar{height:8px;background:#243042;border-radius:4px;overflow:hidden;margin-top:8px}
.bar i{display:block;height:100%;background:var(--accent)}
.w6{grid-column:span 6}.w12{grid-column:span 12}.w7{grid-column:span 7}.w5{grid-column:span 5}
table{width:100%;border-collapse:collapse;font-variant-numeric:tabular-nums}
th{color:var(--dim);font-weight:500;font-size:12px;text-align:right;padding:6px 8px;
border-bottom:1px solid var(--line)}
td{padding:7px 8px;text-align:right;border-bottom:1px solid #1f2732}
th.l,td.l{text-align:left}
tr:last-child td{border-bottom:none}
.pill{display:inline-block;padding:1px 8px;border-radius:99px;font-size:12px;font-weight:600}
.pill.ok{background:rgba(63,182,139,.15);color:var(--ok)}
.pill.missing,.pill.unknown{background:rgba(239,91,91,.18);color:var(--bad)}
.sw{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:6px;
vertical-align:-1px}
.dim{color:var(--dim)}.bad{color:var(--bad)}.warn{color:var(--warn)}
.legend{display:flex;gap:14px;flex-wrap:wrap;font-size:12px;color:var(--dim);margin-top:6px}
svg text{fill:var(--dim);font-size:11px}
.mu{position:relative;display:inline-block;width:90px;height:10px;background:#243042;
border-radius:3px;vertical-align:middle;margin-left:8px}
.mu i{position:absolute;top:0;bottom:0;background:rgba(90,169,255,.35)}
.mu b{position:absolute;top:-2px;bottom:-2px;width:2px;background:var(--accent)}
#problems{grid-column:span 12;display:none;border-color:rgba(239,91,91,.5);color:var(--bad)}
.fail{max-width:260px;white-space:nowrap;overflow:hidden;text-overflow:ellipsis}
</style></head>
<body>
<header><h1>HACO fleet</h1><span class="sub" id="sub">connecting…</span>
<span id="status">waiting for data</span></header>
<main>
<div class="card" id="problems"></div>
<section class="kpis">
 <div class="card kpi"><h2>Invocations</h2><div class="v" id="k-inv">—</div>
  <div class="d" id="k-inv-d">&nbsp;</div></div>
 <div class="card kpi"><h2>Hedge rate</h2><div class="v" id="k-hedge">—</div>
  <div class="d" id="k-hedge-d">&nbsp;</div></div>
 <div class="card kpi"><h2>Backup win rate</h2><div class="v" id="k-bwin">—</div>
  <div class="d" id="k-bwin-d">&nbsp;</div></div>
 <div class="card kpi"><h2>All-failed rate</h2><div class="v" id="k-fail">—</div>
  <div class="d" id="k-fail-d">&nbsp;</div></div>
 <div class="card kpi"><h2>Backup budget</h2><div class="v" id="k-breq">—</div>
  <div class="bar"><i id="b-req" style="width:0"></i></div>
  <div class="d" id="k-breq-d">&nbsp;</div></div>
 <div class="card kpi"><h2>Token budget</h2><div class="v" id="k-bllm">—</div>
  <div class="bar"><i id="b-llm" style="width:0"></i></div>
  <div class="d" id="k-bllm-d">&nbsp;</div></div>
</section>
<section class="card w7"><h2>Selected zone (winner) share over time</h2>
 <div id="share"></div><div class="legend" id="share-legend"></div></section>
<section class="card w5"><h2>Rates over time (trailing minute)</h2>
 <div id="rates"></div><div class="legend">
 <span><span class="sw" style="background:#5aa9ff"></span>hedge rate</span>
 <span><span class="sw" style="background:#ef5b5b"></span>all-failed rate</span>
 <span><span class="sw" style="background:#e8b339"></span>backup win rate</span></div></section>
<section class="card w12"><h2>Zones</h2><table id="zones"><thead><tr>
 <th class="l">zone</th><th class="l">status</th><th>workers</th><th>queued</th>
 <th>in flight</th><th>members</th><th>p50 ms</th><th>p95 ms</th><th>win share</th>
 <th class="l">last failure</th><th>restarts</th></tr></thead><tbody></tbody></table></section>
<section class="card w12"><h2>Candidate profiles</h2><table id="profiles"><thead><tr>
 <th class="l">candidate</th><th class="l">role</th><th class="l">zone</th>
 <th class="l">μ ± σ</th><th>ρ</th><th>latency mean</th><th>p95</th>
 <th>failures int / net / ddl</th><th>calls</th></tr></thead><tbody></tbody></table></section>
</main>
<script>
(function(){
"use strict";
var PALETTE=["#5aa9ff","#3fb68b","#e8b339","#c678dd","#ef8a5b","#56c7d6","#e06c9f","#9aa5b1"];
var POLL_MS=3000,RATE_WINDOW_S=60;
var token=(new URLSearchParams(location.hash.slice(1))).get("token");
var colors={};
function color(z){
 if(!(z in colors)){colors[z]=PALETTE[Object.keys(colors).length%PALETTE.length];}
return colors[z];}
function $(id){return document.getElementById(id);}
function esc(s){return String(s==null?"":s).replace(/[&<>"']/g,function(c){
return {"&":"&amp;","<":"&lt;",">":"&gt;","\\"":"&quot;","'":"&#39;"}[c];});}
function pct(x,d){return x==null?"—":(100*x).toFixed(d==null?1:d)+"%";}
function ms(x){return x==null?"—":Math.round(x*1000)+" ms";}
function num(x){return x==null?"—":Math.round(x).toLocaleString();}
function ago(t,now){var d=Math.max(0,now-t);return d<120?Math.round(d)+"s ago":
d<7200?Math.round(d/60)+"m ago":(d/3600).toFixed(1)+"h ago";}
function svg(w,h,body){return '<svg viewBox="0 0 '+w+' '+h+'" width="100%" height="'+h+
'" preserveAspectRatio="none" role="img">'+body+"</svg>";}
function kpis(d){
 var f=d.fleet,c=f.counters,b=d.budget;
 $("k-inv").textContent=num(c.invocations);
 $("k-inv-d").textContent=num(c["state:won"])+" won · "+num(c["state:deadline"])+" deadline";
 $("k-hedge").textContent=pct(f.hedge_rate);
 $("k-hedge-d").textContent=num(c.hedged)+" hedged · "+num(c.backups)+" backups";
 $("k-bwin").textContent=pct(f.backup_win_rate);
 $("k-bwin-d").textContent=num(c.backup_wins)+" wins · "+pct(f.backup_win_share,0)+" of backups";
 $("k-fail").textContent=pct(f.all_failed_rate,2);
 $("k-fail").className="v"+(f.all_failed_rate>0.01?" bad":"");
 $("k-fail-d").textContent=num(c["state:all_failed"])+" all-failed";
 if(b.error){$("k-breq").textContent="—";$("k-breq-d").textContent=b.error;return;}
 var r=b.request_capacity>0?b.request_tokens/b.request_capacity:0;
 var l=b.llm_capacity>0?b.llm_tokens/b.llm_capacity:0;
 $("k-breq").textContent=b.request_tokens.toFixed(1)+" / "+b.request_capacity;
 $("b-req").style.width=(100*r).toFixed(1)+"%";
 $("b-req").style.background=r<0.2?"var(--bad)":"var(--accent)";
 $("k-breq-d").textContent=num(b.spent_backups)+" spent · "+num(b.exhausted)+" refused";
 $("k-bllm").textContent=pct(l,0);
 $("b-llm").style.width=(100*l).toFixed(1)+"%";
 $("k-bllm-d").textContent=num(b.llm_tokens)+" of "+num(b.llm_capacity)+" LLM tokens";
}
function shareChart(d){
 var bins=d.share.bins,zones=d.zones.map(function(z){return z.zone;});
 var W=760,H=220,L=42,B=22,T=8,R=8,n=bins.length,bw=(W-L-R)/n,body="";
 for(var g=0;g<=4;g++){var y=T+(H-T-B)*(1-g/4);
  body+='<line x1="'+L+'" x2="'+(W-R)+'" y1="'+y+'" y2="'+y+'" stroke="#263041"/>'+
  '<text x="'+(L-6)+'" y="'+(y+4)+'" text-anchor="end">'+(g*25)+'%</text>';}
 var any=false;
 bins.forEach(function(bin,i){
  var tot=0;zones.forEach(function(z){tot+=bin.wins[z]||0;});
  if(!tot)return;any=true;var y=H-B;
  zones.forEach(function(z){var v=(bin.wins[z]||0)/tot;if(!v)return;var h=v*(H-T-B);y-=h;
   body+='<rect x="'+(L+i*bw+1).toFixed(1)+'" y="'+y.toFixed(1)+'" width="'+(bw-2).toFixed(1)+
   '" height="'+h.toFixed(1)+'" fill="'+color(z)+'"><title>'+esc(z)+": "+(bin.wins[z])+" of "+tot+
   "</title></rect>";});
 });
 var span=d.share.bin_s*n;
 body+='<text x="'+L+'" y="'+(H-6)+'">'+Math.round(span/60)+' min ago</text>'+
 '<text x="'+(W-R)+'" y="'+(H-6)+'" text-anchor="end">now</text>';
 if(!any)body+='<text x="'+(W/2)+'" y="'+(H/2)+'" text-anchor="middle">no wins yet</text>';
 $("share").innerHTML=svg(W,H,body);
 $("share-legend").innerHTML=zones.map(function(z){var r=d.zones.filter(function(x){
  return x.zone===z;})[0];return '<span data-zone="'+esc(z)+'"><span class="sw" style="background:'+
  color(z)+'"></span>'+esc(z)+" "+pct(r.win_share,0)+"</span>";}).join("");
}
function ratesChart(d){
 var s=d.series,W=520,H=220,L=42,B=22,T=8,R=8,pts={h:[],f:[],b:[]},body="";
 for(var i=1,j=0;i<s.length;i++){var c=s[i];while(j<i-1&&c.t-s[j].t>RATE_WINDOW_S)j++;
  var a=s[j],dn=c.invocations-a.invocations;if(dn<=0)continue;
  pts.h.push([c.t,(c.hedged-a.hedged)/dn]);pts.f.push([c.t,(c["state:all_failed"]-
  a["state:all_failed"])/dn]);pts.b.push([c.t,(c.backup_wins-a.backup_wins)/dn]);}
 for(var g=0;g<=4;g++){var y=T+(H-T-B)*(1-g/4);
  body+='<line x1="'+L+'" x2="'+(W-R)+'" y1="'+y+'" y2="'+y+'" stroke="#263041"/>'+
  '<text x="'+(L-6)+'" y="'+(y+4)+'" text-anchor="end">'+(g*25)+'%</text>';}
 var t1=d.at,t0=s.length?Math.min(s[0].t,t1-60):t1-60;
 function line(p,col){if(!p.length)return "";var path=p.map(function(q,j){
  var x=L+(W-L-R)*(q[0]-t0)/Math.max(1,t1-t0),y=T+(H-T-B)*(1-Math.min(1,Math.max(0,q[1])));
  return (j?"L":"M")+x.toFixed(1)+" "+y.toFixed(1);}).join(" ");
  var dots=p.length===1?'<circle cx="'+path.split(" ")[0].slice(1)+'" cy="'+path.split(" ")[1]+
  '" r="3" fill="'+col+'"/>':"";
  return '<path d="'+path+'" fill="none" stroke="'+col+'" stroke-width="2"/>'+dots;}
 body+=line(pts.h,"#5aa9ff")+line(pts.f,"#ef5b5b")+line(pts.b,"#e8b339");
 body+='<text x="'+L+'" y="'+(H-6)+'">'+Math.max(1,Math.round((t1-t0)/60))+' min ago</text>'+
 '<text x="'+(W-R)+'" y="'+(H-6)+'" text-anchor="end">now</text>';
 if(!pts.h.length)body+='<text x="'+(W/2)+'" y="'+(H/2)+
  '" text-anchor="middle">sampling… (rates appear as invocations arrive)</text>';
 $("rates").innerHTML=svg(W,H,body);
}
function zonesTable(d){
 $("zones").tBodies[0].innerHTML=d.zones.map(function(z){
  var f=z.last_failure,fail=f?'<span class="warn">'+ago(f.at_s,d.at)+"</span> "+esc(f.candidate)+
  ": "+esc(f.reason||f.kind||f.status):'<span class="dim">—</span>';
  return '<tr data-zone="'+esc(z.zone)+'"><td class="l"><span class="sw" style="background:'+
  color(z.zone)+'"></span>'+esc(z.zone)+'</td><td class="l"><span class="pill '+esc(z.status)+'">'+
  esc(z.status)+"</span></td><td>"+z.workers.length+"</td><td"+(z.queued>0?' class="warn"':"")+">"+
  num(z.queued)+"</td><td>"+num(z.in_flight)+"</td><td>"+z.members+
  (z.failures?' <span class="bad">('+z.failures+" failed)</span>":"")+"</td><td>"+
  (z.latency_p50_s==null?"—":Math.round(z.latency_p50_s*1000))+"</td><td>"+
  (z.latency_p95_s==null?"—":Math.round(z.latency_p95_s*1000))+"</td><td>"+pct(z.win_share,0)+
  '</td><td class="l fail" title="'+esc(f?f.reason:"")+'">'+fail+"</td><td>"+
  (z.restarts==null?"—":z.restarts)+"</td></tr>";}).join("");
}
function profilesTable(d){
 $("profiles").tBodies[0].innerHTML=d.profiles.map(function(p){
  var lo=Math.max(0,p.mu-p.sigma),hi=Math.min(1,p.mu+p.sigma);
  var bar='<span class="mu"><i style="left:'+(100*lo).toFixed(1)+"%;width:"+
  (100*(hi-lo)).toFixed(1)+
  '%"></i><b style="left:'+(100*p.mu).toFixed(1)+'%"></b></span>';
  var fails=[p.fail_internal,p.fail_network,p.fail_deadline].map(function(x){
   return x>0?'<span class="bad">'+pct(x,0)+"</span>":pct(x,0);}).join(" / ");
  return '<tr data-candidate="'+esc(p.candidate)+'"><td class="l">'+esc(p.candidate)+
  '</td><td class="l dim">'+esc(p.role)+'</td><td class="l"><span class="sw" style="background:'+
  color(p.zone)+'"></span>'+esc(p.zone)+'</td><td class="l">'+p.mu.toFixed(3)+" ± "+
  p.sigma.toFixed(3)+bar+"</td><td>"+p.rho.toFixed(3)+"</td><td>"+ms(p.latency_mean_s)+"</td><td>"+
  ms(p.latency_p95_s)+"</td><td>"+fails+"</td><td>"+num(p.calls)+"</td></tr>";}).join("");
}
function render(d){
 d.zones.forEach(function(z){color(z.zone);});
 kpis(d);shareChart(d);ratesChart(d);zonesTable(d);profilesTable(d);
 var missing=d.zones.filter(function(z){return z.status!=="ok";}).map(function(z){return z.zone;});
 var probs=d.problems.slice();
 if(missing.length)probs.unshift("no worker consumes the queue of zone "+missing.join(", "));
 $("problems").style.display=probs.length?"block":"none";
 $("problems").innerHTML=probs.map(esc).join("<br>");
 $("sub").textContent=d.roles.length+" roles · "+d.profiles.length+" candidates · "+
 d.zones.length+" zones · caller "+d.caller_zone+" · from "+(d.sources.join(" + ")||"—");
 $("status").textContent="live · "+new Date(d.at*1000).toLocaleTimeString();
 $("status").className="live";
 document.body.setAttribute("data-loaded","1");
}
function poll(){
 var h={"accept":"application/json"};if(token)h.authorization="Bearer "+token;
 fetch("/v1/dashboard",{headers:h,cache:"no-store"}).then(function(r){
  if(r.status===401)throw new Error("401: open this page as /dashboard#token=<API token>");
  if(!r.ok)throw new Error("HTTP "+r.status);return r.json();
 }).then(render).catch(function(e){$("status").textContent=String(e.message||e);
  $("status").className="err";}).then(function(){setTimeout(poll,POLL_MS);});
}
poll();
})();
</script>
</body></html>
"""
