-- release. ARGV: 1 offset, 2 owner, 3 fence, 4 fence memory (ms).
-- Answers: {'ok'} | {'rejected', kind, detail} | {'corrupt', reason}.
local now = now_micros()
local live, answer = holder_record(now)
if answer then
  return answer
end
if not live then
  -- Already gone: a re-sent release.
  return { 'ok' }
end
if live.s ~= 'i' then
  return { 'rejected', 'settled', live.s }
end
bury(live.nraw, tonumber(ARGV[4]))
return { 'ok' }
