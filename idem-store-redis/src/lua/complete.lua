-- complete. ARGV: 1 offset, 2 owner, 3 fence, 4 retention (us), 5 strict 0|1, 6 fence memory
-- (ms), 7 codec ('' raw, '1' lz4), 8... the result's pieces.
-- Answers: {'ok'} | {'rejected', kind, detail} | {'corrupt', reason}.
local now = now_micros()
local live, answer = holder_record(now)
if answer then
  return answer
end
if not live then
  return { 'rejected', 'not_found' }
end
if live.s == 'c' then
  -- A re-sent complete of the same lease (its reply was lost).
  return { 'ok' }
end
if live.s == 'f' then
  return { 'rejected', 'settled', 'f' }
end
if ARGV[5] == '1' and now >= live.l then
  return { 'rejected', 'lease_expired' }
end
local expires = now + tonumber(ARGV[4])
local fields = { 's', 'c', 'd', fmt(now), 'x', fmt(expires) }
if ARGV[7] ~= '' then
  fields[#fields + 1] = 'z'
  fields[#fields + 1] = ARGV[7]
end
for i = 8, #ARGV do
  fields[#fields + 1] = tostring(i - 8)
  fields[#fields + 1] = ARGV[i]
end
redis.call('HSET', key, unpack(fields))
redis.call('PEXPIRE', key, ttl_ms(expires, now, tonumber(ARGV[6])))
return { 'ok' }
