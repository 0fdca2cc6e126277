-- wrk script: POST the token issue endpoint (the filter answers it; the upstream never sees it).
--   wrk -s scripts/wrk/issue_token.lua URL -- <issue path> [authorization]
local path = "/api/idempotent/token"
local auth = "Bearer wrk"
local req

function init(args)
  if args[1] then path = args[1] end
  if args[2] then auth = args[2] end
  req = wrk.format("POST", path, {["Authorization"] = auth, ["Content-Length"] = "0"}, nil)
end

function request()
  return req
end
