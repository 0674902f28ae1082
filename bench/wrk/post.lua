-- wrk script of the "http" benchmark (bench/http_path.py): POST one fixed JSON body on every
-- connection, then print one result line the benchmark parses.
--
-- Environment: WRK_BODY  the request body (JSON text)
--              WRK_TOKEN a bearer token for the Authorization header (optional)
--
-- The result line is `WRK_RESULT {json}`: requests, duration (µs), bytes, errors (connect, read,
-- write, status = responses with a status above 399, timeout) and latency percentiles in µs.
-- wrk measures a request from its first byte sent to the end of the response (for a stream:
-- the last chunk), per connection, with connections kept alive.

wrk.method = "POST"
wrk.body = os.getenv("WRK_BODY") or error("WRK_BODY is not set")
wrk.headers["Content-Type"] = "application/json"
local token = os.getenv("WRK_TOKEN")
if token ~= nil and token ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. token
end

local function int(x)
    return string.format("%d", math.floor(x + 0.5))
end

function done(summary, latency, requests)
    local e = summary.errors
    local parts = {
        '"requests":' .. int(summary.requests),
        '"duration_us":' .. int(summary.duration),
        '"bytes":' .. int(summary.bytes),
        '"errors":{"connect":' .. int(e.connect) .. ',"read":' .. int(e.read)
            .. ',"write":' .. int(e.write) .. ',"status":' .. int(e.status)
            .. ',"timeout":' .. int(e.timeout) .. '}',
        '"latency_us":{"p50":' .. int(latency:percentile(50))
            .. ',"p90":' .. int(latency:percentile(90))
            .. ',"p99":' .. int(latency:percentile(99))
            .. ',"max":' .. int(latency.max)
            .. ',"mean":' .. int(latency.mean) .. '}',
    }
    io.write("WRK_RESULT {" .. table.concat(parts, ",") .. "}\n")
end
