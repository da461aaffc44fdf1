-- The profile fold of coordinator/core/profiles.py (update_candidate, update_link) in
-- Lua, so a worker's outcome folds into its epoch's delta inside one script: no WATCH,
-- no retry, no process lock. Every arithmetic step is the Python one in the same order,
-- so with an infinite half-life the result is bit for bit the same; a finite one adds
-- at most the difference between two libm pow()s (tests/test_hotpath_store.py).
-- A delta value is a MessagePack map of the profile's fields (coordinator/state/codec.py
-- encode_delta): numbers travel as 8-byte doubles (an integral one as an integer, which
-- the decoder reads back as the same double), so a fold neither prints nor parses a
-- decimal number; a recent-value window is one string of little-endian doubles, oldest
-- first, so a fold appends 8 bytes and cuts the oldest off without touching the rest.
-- Printing each number with 17 digits and counting a window's numbers in text were most
-- of a fold's time when the value was JSON; a window as a MessagePack array still cost
-- a table of 256 numbers unpacked and packed again per fold. A JSON value (written by
-- an older version) and an array window are still read; the fold writes them back packed.
local NULL = cjson.null

local function value(x)  -- JSON's null, or no value at all: nil
  if x == NULL then return nil end
  return x
end

local function decode(raw)
  if string.sub(raw, 1, 1) ~= '{' then return cmsgpack.unpack(raw) end
  local p = cjson.decode(raw)
  for k, v in pairs(p) do
    if v == NULL then p[k] = nil end
  end
  return p
end

local function zero() return {n = 0.0, s1 = 0.0, s2 = 0.0} end
local function scaled(m, w) return {n = m.n * w, s1 = m.s1 * w, s2 = m.s2 * w} end
local function add(m, x, w) return {n = m.n * w + 1.0, s1 = m.s1 * w + x, s2 = m.s2 * w + x * x} end

-- A window as read: packed doubles already, or a table of numbers (JSON, or an array).
local function packed(w)
  if w == nil then return '' end
  if type(w) == 'string' then return w end
  local parts = {}
  for i = 1, #w do parts[i] = struct.pack('<d', w[i]) end
  return table.concat(parts)
end

-- Append ``x`` to the window ``w`` (oldest first) and keep its newest ``size`` values.
local function push(w, x, size)
  w = w .. struct.pack('<d', x)
  local keep = size * 8
  if #w > keep then w = string.sub(w, #w - keep + 1) end
  return w
end

-- ARGV layout of the settings: decay ('none' | 'observations' | 'seconds'), half-life,
-- the per-observation weight (observations), latency window, bandwidth window.
local function weight(cfg, last, at)
  if cfg.decay == 'none' or last == nil then return 1.0 end
  if cfg.decay == 'observations' then return cfg.w_obs end
  local elapsed = at - last
  if elapsed < 0 then elapsed = 0.0 end
  return 0.5 ^ (elapsed / cfg.half_life)
end

local function flag(b) if b then return 1.0 end return 0.0 end

local function fold_candidate(raw, cid, o, cfg)
  local p
  if raw then
    p = decode(raw)
  else
    p = {candidate_id = cid, alpha = 1.0, beta = 1.0, calls = 0.0, delivered = 0.0,
         successes = 0.0, internal_failures = 0.0, network_failures = 0.0,
         deadline_failures = 0.0, quality = zero(), latency = zero(), tokens_in = zero(),
         tokens_out = zero(), observations = 0}
  end
  local failure, at = value(o.failure), value(o.at_s)
  local w = weight(cfg, p.last_seen_s, at)
  local ok = failure == nil
  local alpha = 1.0 + (p.alpha - 1.0) * w
  local beta = 1.0 + (p.beta - 1.0) * w
  local quality = scaled(p.quality, w)
  local q = value(o.quality)
  if ok and q ~= nil then
    alpha = alpha + q
    beta = beta + (1.0 - q)
    quality = add(p.quality, q, w)
  end
  local latency = scaled(p.latency, w)
  local recent = packed(p.recent_latency_s)
  local proc = value(o.proc_latency_s)
  if ok and proc ~= nil then
    latency = add(p.latency, proc, w)
    recent = push(recent, proc, cfg.latency_window)
  end
  local tokens_out = scaled(p.tokens_out, w)
  if ok then tokens_out = add(p.tokens_out, o.tokens_out, w) end
  return cmsgpack.pack({
    candidate_id = p.candidate_id, alpha = alpha, beta = beta,
    calls = p.calls * w + 1.0,
    delivered = p.delivered * w + flag(o.delivered),
    successes = p.successes * w + flag(ok),
    internal_failures = p.internal_failures * w + flag(failure == 'internal'),
    network_failures = p.network_failures * w + flag(failure == 'network'),
    deadline_failures = p.deadline_failures * w + flag(failure == 'deadline'),
    quality = quality, latency = latency, tokens_in = add(p.tokens_in, o.tokens_in, w),
    tokens_out = tokens_out, recent_latency_s = recent,
    observations = p.observations + 1, last_seen_s = at})
end

local function fold_leg(p, o, cfg)
  local at = value(o.at_s)
  local w = weight(cfg, p.last_seen_s, at)
  local bandwidth = scaled(p.bandwidth, w)
  local recent = p.recent_bandwidth_Bps
  local t, rtt_s = value(o.t_transfer_s), value(o.rtt_s)
  if not o.lost and t ~= nil and t > 0 then
    local bps = o.bytes / t
    bandwidth = add(p.bandwidth, bps, w)
    recent = push(recent, bps, cfg.bandwidth_window)
  end
  local rtt = scaled(p.rtt, w)
  if rtt_s ~= nil and not o.lost then rtt = add(p.rtt, rtt_s, w) end
  return {src = p.src, dst = p.dst,
          transmissions = p.transmissions * w + flag(o.can_be_lost),
          losses = p.losses * w + flag(o.lost), bandwidth = bandwidth, rtt = rtt,
          recent_bandwidth_Bps = recent, observations = p.observations + 1,
          last_seen_s = at}
end

local function fold_link(raw, src, dst, legs, cfg)
  local p
  if raw then
    p = decode(raw)
    p.recent_bandwidth_Bps = packed(p.recent_bandwidth_Bps)
  else
    p = {src = src, dst = dst, transmissions = 0.0, losses = 0.0, bandwidth = zero(),
         rtt = zero(), recent_bandwidth_Bps = '', observations = 0}
  end
  for i = 1, #legs do p = fold_leg(p, legs[i], cfg) end
  return cmsgpack.pack({
    src = p.src, dst = p.dst, transmissions = p.transmissions, losses = p.losses,
    bandwidth = p.bandwidth, rtt = p.rtt, recent_bandwidth_Bps = p.recent_bandwidth_Bps,
    observations = p.observations, last_seen_s = p.last_seen_s})
end
