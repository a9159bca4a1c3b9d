#!/bin/bash
# A scripted agent for trying the loop on CPU: asks the policy twice through the proxy
# (OpenAI dialect, the session's OPENAI_BASE_URL) and changes nothing, so every rollout
# ends `no_patch`. Swap in a real harness ([harness] name) for anything but plumbing.
python3 - <<'PY'
import json, os, urllib.request
base = os.environ["OPENAI_BASE_URL"]
msgs = [{"role": "user", "content": open(os.environ["LEGORL_PROBLEM_FILE"]).read()[:400]}]
for _ in range(2):
    body = {"model": "policy", "messages": msgs, "max_tokens": 16}
    req = urllib.request.Request(base + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    reply = json.load(urllib.request.urlopen(req, timeout=120))
    msgs += [reply["choices"][0]["message"], {"role": "user", "content": "continue"}]
PY
