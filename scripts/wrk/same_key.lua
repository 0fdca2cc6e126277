-- wrk script: POST the same request with the same Idempotency-Key every time (replays).
--   wrk -s scripts/wrk/same_key.lua URL -- <path> <key>
local path = "/api/order/create"
local key = "bench-replay"
local body = '{"sku":"A1","qty":1}'
local req

function init(args)
  if args[1] then path = args[1] end
  if args[2] then key = args[2] end
  req = wrk.format("POST", path, {["Idempotency-Key"] = key, ["Content-Type"] = "application/json",
                                  ["Authorization"] = "Bearer bench"}, body)
end

function request()
  return req
end
