-- wrk script: POST with a fresh Idempotency-Key on every request.
--   wrk -s scripts/wrk/unique_keys.lua URL -- <path> <key-prefix> [<body bytes>]
-- The body is a JSON order, padded to <body bytes> when given.
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

-- A JSON order of `size` bytes (at least the unpadded one).
function order_of(size)
  local head, tail = '{"sku":"A1","qty":1,"note":"', '"}'
  local pad = size - #head - #tail
  if pad <= 0 then return body end
  return head .. string.rep("x", pad) .. tail
end

function init(args)
  if args[1] then path = args[1] end
  if args[2] then prefix = args[2] end
  if args[3] then body = order_of(tonumber(args[3])) end
end

function request()
  counter = counter + 1
  return wrk.format("POST", path, {
    ["Idempotency-Key"] = prefix .. "-" .. tid .. "-" .. counter,
    ["Content-Type"] = "application/json",
    ["Authorization"] = "Bearer bench",
  }, body)
end
