-- wrk script: the same POST (no Idempotency-Key), for baselines.
--   wrk -s scripts/wrk/plain_post.lua URL -- <path>
local path = "/"
local body = '{"sku":"A1","qty":1}'
local req

function init(args)
  if args[1] then path = args[1] end
  req = wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end

function request()
  return req
end
