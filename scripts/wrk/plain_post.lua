-- wrk script: the same POST (no Idempotency-Key), for baselines.
--   wrk -s scripts/wrk/plain_post.lua URL -- <path> [<body bytes>]
local path = "/"
local body = '{"sku":"A1","qty":1}'
local req

function init(args)
  if args[1] then path = args[1] end
  if args[2] then
    local head, tail = '{"sku":"A1","qty":1,"note":"', '"}'
    local pad = tonumber(args[2]) - #head - #tail
    if pad > 0 then body = head .. string.rep("x", pad) .. tail end
  end
  req = wrk.format("POST", path, {["Content-Type"] = "application/json"}, body)
end

function request()
  return req
end
