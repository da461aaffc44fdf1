-- The profile fold of coordinator/core/profiles.py (update_candidate, update_link) in
-- Lua, so a worker's outcome folds into its epoch's delta inside one script: no WATCH,
-- no retry, no process lock. Every arithmetic step is the Python one in the same order,
-- so with an infinite half-life the result is bit for bit the same; a finite one adds
-- at most the difference between two libm pow()s (tests/test_hotpath_store.py).
-- Values are the codec's JSON (coordinator/state/codec.py); numbers are written with 17
-- significant digits, which read back as the same double.
local NULL = cjson.null

local function num(x)
  if x ~= x then return 'NaN' end
  if x == math.huge then return 'Infinity' end
  if x == -math.huge then return '-Infinity' end
  return string.format('%.17g', x)
end

local function opt(x)
  if x == nil or x == NULL then return 'null' end
  return num(x)
end

local function mom(m)
  return '{"n":' .. num(m.n) .. ',"s1":' .. num(m.s1) .. ',"s2":' .. num(m.s2) .. '}'
end

local function zero() return {n = 0.0, s1 = 0.0, s2 = 0.0} end
local function scaled(m, w) return {n = m.n * w, s1 = m.s1 * w, s2 = m.s2 * w} end
local function add(m, x, w) return {n = m.n * w + 1.0, s1 = m.s1 * w + x, s2 = m.s2 * w + x * x} end

-- The recent-value windows (up to latency_window = 256 numbers) stay JSON text: a fold
-- appends one number and drops the oldest, so decoding and re-printing every number
-- (most of a fold's time) is skipped. The text is the codec's: '[' numbers ',' ... ']'.
-- Beside each window the fold writes how many numbers it holds ("<window>_n", a key the
-- decoders ignore), so a fold counts nothing: counting the commas of a full window was
-- half of a candidate fold's time. A value without it (written by Python, or before
-- the count existed) is counted once.
local function count(inner)
  if inner == '' then return 0 end
  local commas, at = 0, string.find(inner, ',', 1, true)
  while at do
    commas = commas + 1
    at = string.find(inner, ',', at + 1, true)
  end
  return commas + 1
end

local function cut(raw, name)
  -- raw with the named array emptied (cheap to decode), its inner text and its length
  local _, open = string.find(raw, '"' .. name .. '":[', 1, true)
  if not open then return raw, '', 0 end
  local close = string.find(raw, ']', open, true)
  local inner = string.sub(raw, open + 1, close - 1)
  local tag = ',"' .. name .. '_n":'
  local n
  if string.sub(raw, close + 1, close + #tag) == tag then
    n = tonumber(string.match(raw, '^%d+', close + #tag + 1))
  end
  return string.sub(raw, 1, open) .. string.sub(raw, close), inner, n or count(inner)
end

local function push(inner, n, x, size)
  if inner == '' then inner = num(x) else inner = inner .. ',' .. num(x) end
  n = n + 1
  while n > size do
    inner = string.sub(inner, string.find(inner, ',', 1, true) + 1)
    n = n - 1
  end
  return inner, n
end

-- ARGV layout of the settings: decay ('none' | 'observations' | 'seconds'), half-life,
-- the per-observation weight (observations), latency window, bandwidth window.
local function weight(cfg, last, at)
  if cfg.decay == 'none' or last == nil or last == NULL then return 1.0 end
  if cfg.decay == 'observations' then return cfg.w_obs end
  local elapsed = at - last
  if elapsed < 0 then elapsed = 0.0 end
  return 0.5 ^ (elapsed / cfg.half_life)
end

local function flag(b) if b then return 1.0 end return 0.0 end

local function fold_candidate(raw, cid, o, cfg)
  local p
  local recent, n_recent = '', 0
  if raw then
    raw, recent, n_recent = cut(raw, 'recent_latency_s')
    p = cjson.decode(raw)
  else
    p = {candidate_id = cid, alpha = 1.0, beta = 1.0, calls = 0.0, delivered = 0.0,
         successes = 0.0, internal_failures = 0.0, network_failures = 0.0,
         deadline_failures = 0.0, quality = zero(), latency = zero(), tokens_in = zero(),
         tokens_out = zero(), observations = 0, last_seen_s = NULL}
  end
  local w = weight(cfg, p.last_seen_s, o.at_s)
  local ok = (o.failure == nil or o.failure == NULL)
  local alpha = 1.0 + (p.alpha - 1.0) * w
  local beta = 1.0 + (p.beta - 1.0) * w
  local quality = scaled(p.quality, w)
  if ok and o.quality ~= nil and o.quality ~= NULL then
    alpha = alpha + o.quality
    beta = beta + (1.0 - o.quality)
    quality = add(p.quality, o.quality, w)
  end
  local latency = scaled(p.latency, w)
  if ok and o.proc_latency_s ~= nil and o.proc_latency_s ~= NULL then
    latency = add(p.latency, o.proc_latency_s, w)
    recent, n_recent = push(recent, n_recent, o.proc_latency_s, cfg.latency_window)
  end
  local tokens_out = scaled(p.tokens_out, w)
  if ok then tokens_out = add(p.tokens_out, o.tokens_out, w) end
  return '{"candidate_id":' .. cjson.encode(p.candidate_id)
    .. ',"alpha":' .. num(alpha) .. ',"beta":' .. num(beta)
    .. ',"calls":' .. num(p.calls * w + 1.0)
    .. ',"delivered":' .. num(p.delivered * w + flag(o.delivered))
    .. ',"successes":' .. num(p.successes * w + flag(ok))
    .. ',"internal_failures":' .. num(p.internal_failures * w + flag(o.failure == 'internal'))
    .. ',"network_failures":' .. num(p.network_failures * w + flag(o.failure == 'network'))
    .. ',"deadline_failures":' .. num(p.deadline_failures * w + flag(o.failure == 'deadline'))
    .. ',"quality":' .. mom(quality) .. ',"latency":' .. mom(latency)
    .. ',"tokens_in":' .. mom(add(p.tokens_in, o.tokens_in, w))
    .. ',"tokens_out":' .. mom(tokens_out)
    .. ',"recent_latency_s":[' .. recent .. '],"recent_latency_s_n":' .. n_recent
    .. ',"observations":' .. num(p.observations + 1)
    .. ',"last_seen_s":' .. opt(o.at_s) .. '}'
end

local function fold_leg(p, o, cfg)
  local w = weight(cfg, p.last_seen_s, o.at_s)
  local bandwidth = scaled(p.bandwidth, w)
  local recent, n_recent = p.recent, p.n_recent
  local t = o.t_transfer_s
  if not o.lost and t ~= nil and t ~= NULL and t > 0 then
    local bps = o.bytes / t
    bandwidth = add(p.bandwidth, bps, w)
    recent, n_recent = push(recent, n_recent, bps, cfg.bandwidth_window)
  end
  local rtt = scaled(p.rtt, w)
  if o.rtt_s ~= nil and o.rtt_s ~= NULL and not o.lost then rtt = add(p.rtt, o.rtt_s, w) end
  return {src = p.src, dst = p.dst,
          transmissions = p.transmissions * w + flag(o.can_be_lost),
          losses = p.losses * w + flag(o.lost), bandwidth = bandwidth, rtt = rtt,
          recent = recent, n_recent = n_recent, observations = p.observations + 1,
          last_seen_s = o.at_s}
end

local function fold_link(raw, src, dst, legs, cfg)
  local p
  if raw then
    local recent, n_recent
    raw, recent, n_recent = cut(raw, 'recent_bandwidth_Bps')
    p = cjson.decode(raw)
    p.recent, p.n_recent = recent, n_recent
  else
    p = {src = src, dst = dst, transmissions = 0.0, losses = 0.0, bandwidth = zero(),
         rtt = zero(), recent = '', n_recent = 0, observations = 0, last_seen_s = NULL}
  end
  for i = 1, #legs do p = fold_leg(p, legs[i], cfg) end
  return '{"src":' .. cjson.encode(p.src) .. ',"dst":' .. cjson.encode(p.dst)
    .. ',"transmissions":' .. num(p.transmissions) .. ',"losses":' .. num(p.losses)
    .. ',"bandwidth":' .. mom(p.bandwidth) .. ',"rtt":' .. mom(p.rtt)
    .. ',"recent_bandwidth_Bps":[' .. p.recent .. '],"recent_bandwidth_Bps_n":' .. p.n_recent
    .. ',"observations":' .. num(p.observations)
    .. ',"last_seen_s":' .. opt(p.last_seen_s) .. '}'
end
