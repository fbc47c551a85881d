-- claim. ARGV: 1 offset, 2 fingerprint, 3 owner, 4 lease (us), 5 fence memory (ms), 6 key,
-- 7 scope.
-- Answers: {'acquired', meta, taken_over 0|1} | {'in_flight', micros} | {'completed', fields...}
-- | {'failed', fields...} | {'mismatch'} | {'corrupt', reason}.
local raw = redis.pcall('HGETALL', key)
if raw.err then
  return { 'corrupt', 'the key does not hold a hash' }
end
local prev = 0
local live = false
local s, z, a, n, c, t, x
if #raw > 0 then
  local m, p, k, g
  for i = 1, #raw, 2 do
    local f = raw[i]
    if f == 'm' then
      m = raw[i + 1]
    elseif f == 'p' then
      p = raw[i + 1]
    elseif f == 'k' then
      k = raw[i + 1]
    elseif f == 'g' then
      g = raw[i + 1]
    end
  end
  if not m then
    return { 'corrupt', 'the hash has no meta field' }
  end
  s, z, a, n, c, t, x = unmeta(m)
  if not s then
    return { 'corrupt', 'the meta field is garbled' }
  end
  prev = n
  if s ~= '-' and now < x then
    if not p or #p ~= 32 or not k then
      return { 'corrupt', 'the fingerprint or the key is missing' }
    end
    if k ~= ARGV[6] or (g or '') ~= ARGV[7] then
      return { 'corrupt', 'the hash holds the record of another key' }
    end
    -- Mismatch is checked first: it wins over every state.
    if p ~= ARGV[2] then
      return { 'mismatch' }
    end
    -- The fields follow the answer's tag in the reply itself: `unpack` fails on a hash with
    -- thousands of (foreign) fields, which the decoder must see to call it corrupt.
    if s == 'c' then
      table.insert(raw, 1, 'completed')
      return raw
    end
    if s == 'f' then
      table.insert(raw, 1, 'failed')
      return raw
    end
    if now < t then
      -- The same owner token means this very claim was sent twice (a lost reply): same answer.
      if string.sub(m, 35, 50) == ARGV[3] then
        if a > 1 then
          return { 'acquired', m, '1' }
        end
        return { 'acquired', m, '0' }
      end
      return { 'in_flight', struct.pack('>I7', t - now) }
    end
    live = true
  end
  -- Replaced whole: no field of the old record stays behind.
  redis.call('DEL', key)
end
-- Absent, expired, or in flight with a lapsed lease: grant. A dead record's fence still counts.
local fence = now
if prev >= fence then
  fence = prev + 1
end
local lease = tonumber(ARGV[4])
local lease_until = now + lease
local expires = lease_until + lease
local attempt = 1
local created = now
local taken_over = '0'
if live then
  attempt = a + 1
  if attempt > 4294967295 then
    attempt = 4294967295
  end
  created = c
  taken_over = '1'
end
local m = struct.pack(HELD, 'i', '0', attempt, fence, created, lease_until, expires, ARGV[3])
if ARGV[7] == '' then
  redis.call('HSET', key, 'm', m, 'p', ARGV[2], 'k', ARGV[6])
else
  redis.call('HSET', key, 'm', m, 'p', ARGV[2], 'k', ARGV[6], 'g', ARGV[7])
end
redis.call('PEXPIRE', key, ttl_ms(expires, tonumber(ARGV[5])))
return { 'acquired', m, taken_over }
