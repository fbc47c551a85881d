-- idem: shared helpers of every script. KEYS[1] is the record's hash; ARGV[1] is an offset in
-- microseconds added to the server's clock (0 outside tests).
--
-- Fields of a record (see src/layout.rs): s state (i in flight, c completed, f failed,
-- - tombstone), p fingerprint (32 bytes), o owner (16 bytes), n fence, l lease_until,
-- a attempt, c created_at, d completed_at, x expires_at (microseconds, decimal), k key,
-- g scope, e failure message, z result codec (1 = lz4), and the result in pieces 0, 1, ...
local key = KEYS[1]

-- Integers are doubles in Lua: every number here stays below 2^53 (the store clamps durations).
local function fmt(n)
  return string.format('%.0f', n)
end

local function now_micros()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
end

-- A non-negative integer from its canonical decimal text, or nil.
local function uint(text)
  if type(text) ~= 'string' or #text > 16 or not string.match(text, '^%d+$') then
    return nil
  end
  if #text > 1 and string.sub(text, 1, 1) == '0' then
    return nil
  end
  local n = tonumber(text)
  if n > 9007199254740991 then
    return nil
  end
  return n
end

-- The physical TTL: the record's own expiry plus the time its fence is remembered.
local function ttl_ms(expires, now, memory_ms)
  local ms = math.ceil((expires - now) / 1000)
  if ms < 0 then
    ms = 0
  end
  return ms + memory_ms + 1
end

-- Removes the record, keeping only its fence for memory_ms, so the next grant's fence is higher
-- even if the server clock has not moved (or moved back).
local function bury(fence_text, memory_ms)
  redis.call('DEL', key)
  if memory_ms > 0 then
    redis.call('HSET', key, 's', '-', 'n', fence_text)
    redis.call('PEXPIRE', key, memory_ms)
  end
end

local KNOWN = { s = true, p = true, o = true, n = true, l = true, a = true, c = true, d = true,
  x = true, k = true, g = true, e = true, z = true }

-- The record at KEYS[1]: (nil) when absent; (record, raw fields); or (nil, nil, reason) when it
-- cannot be decoded or breaks the record invariants. A tombstone is a record with tomb = true.
local function load()
  local raw = redis.pcall('HGETALL', key)
  if type(raw) ~= 'table' or raw.err then
    return nil, nil, 'the key does not hold a hash'
  end
  if #raw == 0 then
    return nil
  end
  local f = {}
  local pieces = 0
  for i = 1, #raw, 2 do
    local name = raw[i]
    if string.match(name, '^%d+$') then
      pieces = pieces + 1
    elseif not KNOWN[name] then
      return nil, nil, 'unknown field'
    end
    f[name] = raw[i + 1]
  end
  local n = uint(f.n)
  if not n or n < 1 then
    return nil, nil, 'the fence is missing or zero'
  end
  if f.s == '-' then
    return { tomb = true, n = n, nraw = f.n }, raw
  end
  local s = f.s
  if s ~= 'i' and s ~= 'c' and s ~= 'f' then
    return nil, nil, 'unknown state'
  end
  if type(f.p) ~= 'string' or #f.p ~= 32 then
    return nil, nil, 'the fingerprint is not 32 bytes'
  end
  if type(f.o) ~= 'string' or #f.o ~= 16 then
    return nil, nil, 'the owner token is not 16 bytes'
  end
  if type(f.k) ~= 'string' or #f.k == 0 then
    return nil, nil, 'the key is missing'
  end
  local l, a, c, x = uint(f.l), uint(f.a), uint(f.c), uint(f.x)
  if not (l and a and c and x) then
    return nil, nil, 'a time or the attempt count is missing or not a number'
  end
  if a < 1 or a > 4294967295 then
    return nil, nil, 'the attempt count is out of range'
  end
  local d = nil
  if f.d ~= nil then
    d = uint(f.d)
    if not d then
      return nil, nil, 'the completion time is not a number'
    end
  end
  if f.z ~= nil and f.z ~= '1' then
    return nil, nil, 'unknown result codec'
  end
  for i = 0, pieces - 1 do
    if f[tostring(i)] == nil then
      return nil, nil, 'the result pieces are not numbered 0 to n-1'
    end
  end
  if s == 'i' then
    if pieces > 0 then
      return nil, nil, 'an in-flight record holds a result'
    end
    if f.e ~= nil then
      return nil, nil, 'an in-flight record holds a failure'
    end
    if d ~= nil then
      return nil, nil, 'an in-flight record has a completion time'
    end
  elseif s == 'c' and pieces == 0 then
    return nil, nil, 'a completed record has no result'
  elseif s == 'f' and f.e == nil then
    return nil, nil, 'a failed record has no failure'
  end
  if s ~= 'i' and d == nil then
    return nil, nil, 'a settled record has no completion time'
  end
  return { s = s, p = f.p, o = f.o, n = n, nraw = f.n, l = l, a = a, c = c, x = x, d = d,
    k = f.k, g = f.g or '' }, raw
end

-- The record a holder (owner ARGV[2], fence ARGV[3]) presents: (nil) when there is no live
-- record, (record) when it holds it, or (nil, rejection) when another attempt does.
local function held(rec, now)
  if rec == nil or rec.tomb or now >= rec.x then
    return nil
  end
  if rec.o ~= ARGV[2] or rec.nraw ~= ARGV[3] then
    return nil, { 'rejected', 'superseded', rec.nraw }
  end
  return rec
end

-- The record of the holder (owner ARGV[2], fence ARGV[3]) at now: (record) when it holds a live
-- one, (nil) when there is no live record, or (nil, answer) to give at once (corrupt, or held by
-- another attempt).
local function holder_record(now)
  local rec, _, bad = load()
  if bad then
    return nil, { 'corrupt', bad }
  end
  return held(rec, now)
end

-- An answer that carries the whole record, for the client to decode.
local function with_record(tag, now, raw)
  local out = { tag, fmt(now) }
  for i = 1, #raw do
    out[#out + 1] = raw[i]
  end
  return out
end

