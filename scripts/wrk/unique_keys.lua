-- wrk script: POST with a fresh Idempotency-Key on every request.
--   wrk -s scripts/wrk/unique_keys.lua URL -- <path> <key-prefix>
-- Keys are <prefix>-<thread>-<counter>, unique across threads and (with a new prefix) across runs.
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local path = "/api/order/create"
local prefix = "k"
local counter = 0
local body = '{"sku":"A1","qty":1}'

function init(args)
  if args[1] then path = args[1] end
  if args[2] then prefix = args[2] end
end

function request()
  counter = counter + 1
  return wrk.format("POST", path, {
    ["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. counter,
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer bench",
  }, body)
end
