"""The one Lua script behind `RedisLimiter`: a whole admission (or finish) in one atomic step.

Time is Redis's own (`TIME`), as seconds since 2024-01-01 in a double (15 ns resolution
today), so replicas with skewed clocks share one timeline.  Only TATs and stream slot expiries
are stored, all as numbers, under keys made of the prefix and the principal key.
"""

from __future__ import annotations

import hashlib

from .gcra import TOLERANCE_S

__all__ = ["SCRIPT", "SCRIPT_SHA"]

_SOURCE = """
-- airgate rate limits: GCRA for requests and tokens, stream slots with a TTL.
-- KEYS[1] request TAT, KEYS[2] token TAT: strings, seconds since 2024-01-01 (Redis's clock),
--         expiring when the TAT is reached (an absent TAT means idle)
-- KEYS[3] stream slots: sorted set, slot id -> expiry on the same clock
-- 'admit', interval_r, capacity_r, interval_t, capacity_t, cost, streams, ttl, slot
--     (interval 0 / streams 0: that dimension is unlimited)
--     -> {allowed, ahead_r, wait_r, ahead_t, wait_t, streams_full}
-- 'finish', interval_t, tokens used - reserved, slot ('' for none) -> 1
if redis.replicate_commands then redis.replicate_commands() end  -- Redis < 5: TIME then writes
local t = redis.call('TIME')
local now = (tonumber(t[1]) - 1704067200) + tonumber(t[2]) / 1000000
local TOLERANCE = @TOLERANCE@

local function num(x) return string.format('%.17g', x) end

local function ahead(key)
  local tat = tonumber(redis.call('GET', key))
  if tat and tat > now then return tat - now end
  return 0
end

local function store(key, a)
  if a <= 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, num(now + a), 'PX', string.format('%.0f', math.ceil(a * 1000)))
  end
end

local function wait(a, cost, interval, capacity)
  local w = a + cost * interval - capacity
  if w > TOLERANCE then return w end
  return 0
end

local op = ARGV[1]
if op == 'admit' then
  local ri, rc = tonumber(ARGV[2]), tonumber(ARGV[3])
  local ti, tc, cost = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local smax, ttl, slot = tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9]
  local ra, rw, ta, tw, full = 0, 0, 0, 0, 0
  if ri > 0 then ra = ahead(KEYS[1]); rw = wait(ra, 1, ri, rc) end
  if ti > 0 then ta = ahead(KEYS[2]); tw = wait(ta, cost, ti, tc) end
  if smax > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', num(now))
    if redis.call('ZCARD', KEYS[3]) >= smax then full = 1 end
  end
  local ok = rw == 0 and tw == 0 and full == 0
  if ok then
    if ri > 0 then ra = ra + ri; store(KEYS[1], ra) end
    if ti > 0 then ta = ta + cost * ti; store(KEYS[2], ta) end
    if smax > 0 then
      redis.call('ZADD', KEYS[3], num(now + ttl), slot)
      redis.call('PEXPIRE', KEYS[3], string.format('%.0f', math.ceil(ttl * 1000)))
    end
  end
  return {ok and 1 or 0, num(ra), num(rw), num(ta), num(tw), full}
elseif op == 'finish' then
  local ti, delta, slot = tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
  if ti > 0 and delta ~= 0 then store(KEYS[2], ahead(KEYS[2]) + delta * ti) end
  if slot ~= '' then redis.call('ZREM', KEYS[3], slot) end
  return 1
end
return redis.error_reply('airgate limits: unknown operation')
"""

SCRIPT = _SOURCE.replace("@TOLERANCE@", repr(TOLERANCE_S))
SCRIPT_SHA = hashlib.sha1(SCRIPT.encode(), usedforsecurity=False).hexdigest()  # Redis's name
