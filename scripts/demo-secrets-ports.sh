# Sourced by scripts/demo-host.sh: the secrets and ports part of the demo.

# An agent calls a local "model API" with a key it cannot print (the
# broker puts the key in on the way out, only to model.test), then builds a
# web app in its session that the host opens through the gateway's
# /v1/ports/ in headless Chromium (a screenshot in $5).
# $1: alloxctl (its socket in ALLOX_SOCKET); $2: the gateway's address;
# $3: its token; $4: a scratch directory; $5: where the screenshot goes;
# $6: the model API's port (model.test resolves to 127.0.0.1 for the
# broker); $7: another port of 127.0.0.1 the agent may reach (pypi.test's).
allox_demo_secrets_and_ports() {
    local ctl=$1 gw=$2 token=$3 work=$4 shot=$5 mport=$6 other=$7
    say() { echo; echo "\$ alloxctl $*"; "$ctl" "$@"; }
    echo; echo "# a credential the agent uses but never holds: a local \"model API\" that wants a key"
    local key
    key=sk-demo-$(head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n')
    cat >"$work/model_api.py" <<'PY'
import http.server, sys
key = sys.argv[2]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        ok = self.headers.get("Authorization") == "Bearer " + key
        body = b'{"reply": "hello from the model"}\n' if ok else b'{"error": "bad key"}\n'
        self.send_response(200 if ok else 401)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
    python3 "$work/model_api.py" "$mport" "$key" &
    MODEL=$!
    for _ in $(seq 100); do curl -s -o /dev/null -X POST "http://127.0.0.1:$mport/" && break; sleep 0.05; done
    say agent create agent-llm --network proxy --allow model.test --allow "127.0.0.1:$mport" \
        --allow pypi.test --allow "127.0.0.1:$other"
    say session create agent-llm session-1
    echo; echo "\$ alloxctl secret set agent-llm MODEL_API_KEY --host model.test --header 'Authorization: Bearer {}' --value-env MODEL_KEY"
    MODEL_KEY=$key "$ctl" secret set agent-llm MODEL_API_KEY --host model.test \
        --header 'Authorization: Bearer {}' --value-env MODEL_KEY
    echo; echo "# the agent prints its environment: only a placeholder; its call to the model works"
    say exec agent-llm session-1 -- sh -c "env | grep MODEL_API_KEY; \
        curl -sS -X POST http://model.test:$mport/v1/chat -d '{\"prompt\": \"hi\"}'"
    echo; echo "# sent anywhere else, the key stays a placeholder, and the audit says so"
    say exec agent-llm session-1 -- sh -c "curl -sS -o /dev/null -w 'pypi.test answered %{http_code}\n' \
        -H \"Authorization: Bearer \$MODEL_API_KEY\" http://pypi.test:$other/"
    say net audit agent-llm session-1

    echo; echo "# the agent's web app, served to the host through the gateway and opened in a browser"
    cat >"$work/index.html" <<'HTML'
<!doctype html><meta charset=utf-8><title>Agent app</title>
<body style="font-family: sans-serif; margin: 2em">
<h1>Built by agent-llm in session-1</h1>
<p>Served from the session's own loopback, at the port's own host: <code id=at></code>.</p>
<p id=out>loading…</p>
<script>at.textContent = location.host; fetch("status.json").then(r => r.json()).then(j => { out.textContent = "status.json: " + JSON.stringify(j); });</script>
HTML
    say exec agent-llm session-1 -- sh -c 'mkdir -p app && printf "{\"tests\": \"passing\", \"port\": 8000}" > app/status.json'
    say cp "$work/index.html" agent-llm/session-1:app/index.html
    say start agent-llm session-1 -- python3 -m http.server 8000 --bind 127.0.0.1 --directory app
    for _ in $(seq 50); do
        "$ctl" exec agent-llm session-1 -- python3 -c 'import socket; socket.create_connection(("127.0.0.1", 8000), 1)' \
            2>/dev/null && break
        sleep 0.1
    done
    say port expose agent-llm session-1 8000
    local ptoken phost
    ptoken=$("$ctl" --json port list agent-llm session-1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["ports"][0]["token"])')
    phost=$("$ctl" --json port list agent-llm session-1 |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["ports"][0]["host"])')
    echo; echo "\$ curl -sS -H \"Authorization: Bearer \$(alloxctl token)\" http://$gw/v1/ports/agent-llm/session-1/8000/status.json"
    curl -sS -H "Authorization: Bearer $token" "http://$gw/v1/ports/agent-llm/session-1/8000/status.json"; echo
    echo; echo "\$ curl -sS -o /dev/null -w '%{http_code} %{redirect_url}\n' http://$gw/v1/ports/agent-llm/session-1/8000/    # no token: to the port's own host"
    curl -sS -o /dev/null -w '%{http_code} %{redirect_url}\n' "http://$gw/v1/ports/agent-llm/session-1/8000/"
    echo; echo "\$ curl -sS -o /dev/null -w '%{http_code}\n' http://$phost.localhost:${gw##*:}/    # there, no token"
    curl -sS -o /dev/null -w '%{http_code}\n' "http://$phost.localhost:${gw##*:}/"
    if command -v chromium >/dev/null; then
        echo; echo "\$ chromium --headless --screenshot=$shot \"http://$gw/v1/ports/agent-llm/session-1/8000/?token=\$PORT_TOKEN\""
        chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage \
            --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE *.localhost" \
            --proxy-server=127.0.0.1:9 --proxy-bypass-list="127.0.0.1;*.localhost" --user-data-dir="$work/chromium" --hide-scrollbars \
            --virtual-time-budget=10000 --window-size=900,300 --screenshot="$shot" \
            "http://$gw/v1/ports/agent-llm/session-1/8000/?token=$ptoken" 2>/dev/null
        echo "    the page as the browser rendered it: $shot"
    fi
    say port list agent-llm
}
