-- delete (an operator's action). ARGV: 1 offset, 2 fence memory (ms).
-- Answers: {'deleted', 1|0}: whether a live record was there. A corrupt record is removed
-- whole (and counts as there).
local now = now_micros()
local rec, _, bad = load()
if bad then
  redis.call('DEL', key)
  return { 'deleted', '1' }
end
if rec == nil or rec.tomb then
  return { 'deleted', '0' }
end
bury(rec.nraw, tonumber(ARGV[2]))
if now < rec.x then
  return { 'deleted', '1' }
end
return { 'deleted', '0' }
