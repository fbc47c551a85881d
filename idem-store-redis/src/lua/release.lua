-- release. ARGV: 1 offset, 2 owner, 3 fence, 4 fence memory (ms).
-- Answers: {'ok'} | {'rejected', kind, detail} | {'corrupt', reason}.
if answer == 'none' then
  -- Already gone: a re-sent release.
  return { 'ok' }
end
if answer then
  return answer
end
if s ~= 'i' then
  return { 'rejected', 'settled', s }
end
bury(n, tonumber(ARGV[4]))
return { 'ok' }
