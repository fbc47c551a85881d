-- complete. ARGV: 1 offset, 2 owner, 3 fence, 4 retention (us), 5 strict 0|1, 6 fence memory
-- (ms), 7 codec ('0' as is, '1' lz4), 8... the result's pieces as field name, value pairs
-- ('0', piece, '1', piece...).
-- Answers: {'ok'} | {'rejected', kind, detail} | {'corrupt', reason}.
if answer == 'none' then
  return { 'rejected', 'not_found' }
end
if answer then
  return answer
end
if s == 'c' then
  -- A re-sent complete of the same lease (its reply was lost).
  return { 'ok' }
end
if s == 'f' then
  return { 'rejected', 'settled', 'f' }
end
if ARGV[5] == '1' and now >= t then
  return { 'rejected', 'lease_expired' }
end
local expires = now + tonumber(ARGV[4])
-- The owner, fence and lease of the attempt stay; the completion time is appended.
redis.call('HSET', key, 'm', struct.pack(SETTLED, 'c', ARGV[7], a, n, c, t, expires, ARGV[2], now),
  unpack(ARGV, 8))
redis.call('PEXPIRE', key, ttl_ms(expires, tonumber(ARGV[6])))
return { 'ok' }
