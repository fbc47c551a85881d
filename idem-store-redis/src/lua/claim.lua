-- claim. ARGV: 1 offset, 2 fingerprint, 3 owner, 4 lease (us), 5 fence memory (ms), 6 key,
-- 7 scope.
-- Answers: {'acquired', fence, lease_until, attempt, taken_over 0|1} | {'in_flight', micros}
-- | {'completed', now, fields...} | {'failed', now, fields...} | {'mismatch'}
-- | {'corrupt', reason}.
local now = now_micros()
local rec, raw, bad = load()
if bad then
  return { 'corrupt', bad }
end
local live = nil
if rec and not rec.tomb and now < rec.x then
  live = rec
end
if live then
  if live.k ~= ARGV[6] or live.g ~= ARGV[7] then
    return { 'corrupt', 'the hash holds the record of another key' }
  end
  -- Mismatch is checked first: it wins over every state.
  if live.p ~= ARGV[2] then
    return { 'mismatch' }
  end
  if live.s == 'c' then
    return with_record('completed', now, raw)
  end
  if live.s == 'f' then
    return with_record('failed', now, raw)
  end
  if now < live.l then
    -- The same owner token means this very claim was sent twice (a lost reply): same answer.
    if live.o == ARGV[3] then
      local again = '0'
      if live.a > 1 then
        again = '1'
      end
      return { 'acquired', live.nraw, fmt(live.l), fmt(live.a), again }
    end
    return { 'in_flight', fmt(live.l - now) }
  end
end
-- Absent, expired, or in flight with a lapsed lease: grant. A dead record's fence still counts.
local fence = now
if rec and rec.n + 1 > fence then
  fence = rec.n + 1
end
local lease = tonumber(ARGV[4])
local lease_until = now + lease
local expires = lease_until + lease
local attempt = 1
local created = now
local taken_over = '0'
if live then
  attempt = math.min(live.a + 1, 4294967295)
  created = live.c
  taken_over = '1'
end
if rec then
  redis.call('DEL', key)
end
local fields = { 's', 'i', 'p', ARGV[2], 'o', ARGV[3], 'n', fmt(fence), 'l', fmt(lease_until),
  'a', fmt(attempt), 'c', fmt(created), 'x', fmt(expires), 'k', ARGV[6] }
if ARGV[7] ~= '' then
  fields[#fields + 1] = 'g'
  fields[#fields + 1] = ARGV[7]
end
redis.call('HSET', key, unpack(fields))
redis.call('PEXPIRE', key, ttl_ms(expires, now, tonumber(ARGV[5])))
return { 'acquired', fmt(fence), fmt(lease_until), fmt(attempt), taken_over }
