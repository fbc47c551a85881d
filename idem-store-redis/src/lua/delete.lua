-- delete (an operator's action). ARGV: 1 offset, 2 fence memory (ms).
-- Answers: {'deleted', 1|0}: whether a live record was there. A corrupt record is removed
-- whole (and counts as there).
local m = redis.pcall('HGET', key, 'm')
if m == false then
  -- Absent, or a hash that is not a record.
  if redis.call('DEL', key) == 1 then
    return { 'deleted', '1' }
  end
  return { 'deleted', '0' }
end
local s, n, x
if type(m) == 'string' then
  local _
  s, _, _, n, _, _, x = unmeta(m)
end
if not s then
  redis.call('DEL', key)
  return { 'deleted', '1' }
end
if s == '-' then
  return { 'deleted', '0' }
end
bury(n, tonumber(ARGV[2]))
if now < x then
  return { 'deleted', '1' }
end
return { 'deleted', '0' }
