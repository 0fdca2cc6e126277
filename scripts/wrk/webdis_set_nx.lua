-- wrk script: straight against Webdis, the filter's claim command with a fresh key every request:
--   SET <prefix>-<thread>-<counter> <in-flight record> NX PX 30000 GET
-- (POST / with the command in the body, basic auth for the Webdis ACL), i.e. the store's own ceiling.
--   wrk -s scripts/wrk/webdis_set_nx.lua URL -- <key-prefix> <user:password as base64>
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end

local prefix = "bench"
local auth = ""
local counter = 0
-- About the size of the filter's in-flight record: I|owner|fingerprint|first_seen|lease_end
local record = "I%7C56cc7c3efc9eea03%7C88e125cf438864209ce21cafe5b32f8f%7C1795944154646%7C1795944184646"

function init(args)
  if args[1] then prefix = args[1] end
  if args[2] then auth = args[2] end
end

function request()
  counter = counter + 1
  local body = "SET/idem-bench%3A" .. prefix .. "-" .. tid .. "-" .. counter .. "/" .. record .. "/NX/PX/30000/GET"
  return wrk.format("POST", "/", {
    ["Authorization"] = "Basic " .. auth,
    ["Content-Type"] = "text/plain",
  }, body)
end
