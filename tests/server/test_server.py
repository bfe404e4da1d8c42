"""`localspec serve` as a real process, driven by clients other people wrote: the official `openai`
package, httpx with llama.vim's and llama.vscode's exact /infill request bodies, raw SSE."""

from __future__ import annotations

import http.client
import json
import threading

import httpx
import openai
import pytest
from conftest import THREADS
from serverkit import VIM_FIM, run_cli

from harness.serverproc import ServerProcess

# llama.vim's ring-buffer update (s:ring_update): warm the cache with extra context, predict nothing
VIM_RING = {"id_slot": 0, "input_prefix": "", "input_suffix": "",
            "input_extra": [{"text": "import the data\n", "filename": "io.py"}], "prompt": "", "n_predict": 0,
            "temperature": 0.0, "samplers": [], "stream": False, "cache_prompt": True, "t_max_prompt_ms": 1,
            "t_max_predict_ms": 1, "response_fields": [""]}
# llama.vscode (src/llama-server.ts at 3938fb3, 2026-08-19: createRequestPayload with defaultRequestParams; it
# cannot run headless, so its requests are replayed as its current source builds them; "model" is sent only
# when one is configured)
VSCODE_FIM = {"id_slot": 0, "input_prefix": "def hello world\n", "input_suffix": "\n", "input_extra": [],
              "prompt": "    ", "n_predict": 24, "n_cmpl": 1, "top_k": 40, "top_p": 0.99, "stream": False,
              "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "n_indent": 4,
              "t_max_prompt_ms": 500, "t_max_predict_ms": 2500, "model": "qwen2.5-coder:1.5b"}
# its cache warm-up (createRequestPayload with noPredict)
VSCODE_WARM = {"id_slot": 0, "input_prefix": "def hello world\n", "input_suffix": "\n",
               "input_extra": [{"text": "import the data\n", "filename": "io.py"}], "prompt": "", "n_predict": 0,
               "samplers": [], "cache_prompt": True, "t_max_prompt_ms": 500, "t_max_predict_ms": 1}


@pytest.fixture(scope="module")
def server(tiny, tmp_path_factory):
    srv = ServerProcess(["--target", str(tiny.fim_target), "--draft", str(tiny.fim_draft), "--threads", str(THREADS),
                         "-c", "1024", "--temperature", "0"], tmp_path_factory.mktemp("serve-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def post(server, path: str, body, headers_extra: dict | None = None, **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content,
                      headers={"Content-Type": "application/json", **(headers_extra or {})}, timeout=120, **kw)


# --- the openai package ----------------------------------------------------------------------------
def test_chat_with_the_openai_package(oai):
    r = oai.chat.completions.create(model="fim-target", messages=[{"role": "user", "content": "hello world"}],
                                    max_tokens=16, temperature=0)
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    text = r.choices[0].message.content
    assert text and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    extra = r.model_extra
    assert extra["timings"]["predicted_n"] == r.usage.completion_tokens
    assert {"acceptance_rate", "mean_accepted_length", "target_passes", "drafters"} <= set(extra["localspec"])
    # streamed, with the usage chunk: the same text, piece by piece
    chunks = list(oai.chat.completions.create(model="fim-target", messages=[{"role": "user", "content": "hello world"}],
                                              max_tokens=16, temperature=0, stream=True,
                                              stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == r.usage.completion_tokens
    assert chunks[-2].choices[0].finish_reason == r.choices[0].finish_reason


def test_predicted_outputs_with_the_openai_package(oai, server):
    """OpenAI's `prediction`: the same answer, drafted from the predicted text, counted in usage as OpenAI does."""
    msgs = [{"role": "user", "content": "hello world"}]
    text = oai.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0).choices[0].message.content
    r = oai.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0,
                                    prediction={"type": "content", "content": text},
                                    extra_body={"spec": "on", "drafter": "ngram"})
    assert r.choices[0].message.content == text
    d = r.usage.completion_tokens_details  # the tiny model's text is bytes that tokenize otherwise: counts only
    n_predicted = len(post(server, "/tokenize", {"content": text}).json()["tokens"])
    assert d.accepted_prediction_tokens + d.rejected_prediction_tokens == n_predicted
    assert r.model_extra["timings"]["draft_n_accepted"] >= d.accepted_prediction_tokens
    bad = post(server, "/v1/chat/completions", {"messages": msgs, "prediction": {"type": "image"}})
    assert bad.status_code == 400 and "prediction" in bad.json()["error"]["message"]


def test_completions_with_the_openai_package(oai):
    r = oai.completions.create(model="fim-target", prompt="the cache of the model", max_tokens=12, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text and r.usage.completion_tokens <= 12
    streamed = list(oai.completions.create(model="fim-target", prompt="the cache of the model", max_tokens=12,
                                           temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text
    models = oai.models.list()
    assert [m.id for m in models.data] == ["fim-target"]


def test_any_model_name_is_served_by_the_one_pair(oai, server):
    """llama-server's one-model contract: aider's gpt-4o, LangChain's gpt-3.5-turbo, llama.vim's "" all get the
    loaded pair, and the reply names it."""
    for name in ("gpt-4o", "gpt-3.5-turbo", "", "FIM-TARGET"):
        r = oai.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        assert r.model == "fim-target", name
    # llama.vim's exact header with no key configured (httpx refuses to send it; curl, which llama.vim uses, does)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    conn.request("POST", "/infill", json.dumps({"model": "", "input_prefix": "def f(", "input_suffix": ")",
                                                "n_predict": 2}),
                 {"Content-Type": "application/json", "Authorization": "Bearer "})
    resp = conn.getresponse()
    assert resp.status == 200, resp.read()
    conn.close()
    r = post(server, "/v1/chat/completions", {"model": ["x"], "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and '"model" must be a string' in r.json()["error"]["message"]


def test_errors_surface_as_the_sdks_exceptions(oai):
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="fim-target", messages=[])
    assert "messages" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model="fim-target", messages=[{"role": "user", "content": "the " * 1200}])
    assert e.value.body["type"] == "exceed_context_size_error" and e.value.body["n_ctx"] == 1024


# --- llama.cpp's native endpoints, editors' exact requests ------------------------------------------------
def test_llama_vim_and_vscode_infill_requests(server):
    r = post(server, "/infill", VIM_RING)
    assert r.status_code == 200 and r.json() == {}  # response_fields [""]: nothing, as llama-server answers
    r = post(server, "/infill", VIM_FIM)
    assert r.status_code == 200
    body = r.json()
    assert set(body) == set(VIM_FIM["response_fields"])  # flat "timings/..." keys, as llama.vim reads them
    assert isinstance(body["content"], str) and body["timings/predicted_n"] <= 32
    for line in body["content"].split("\n")[1:]:  # n_indent 4: no line after the first dedents
        assert not line.strip() or len(line) - len(line.lstrip(" \t")) >= 4
    again = post(server, "/infill", VIM_FIM).json()
    assert again["timings/prompt_n"] < body["timings/prompt_n"] or body["timings/prompt_n"] <= 1  # prefix reused
    assert again["tokens_cached"] > 0
    assert post(server, "/infill", VSCODE_WARM).status_code == 200
    r = post(server, "/infill", VSCODE_FIM)
    assert r.status_code == 200 and isinstance(r.json()["content"], str)  # llama.vscode reads .content
    full = r.json()
    assert {"timings", "tokens_cached", "truncated", "stop_type", "generation_settings"} <= set(full)


def test_infill_errors(server, tiny, tmp_path):
    assert post(server, "/infill", {"input_suffix": ""}).json()["error"]["message"] == '"input_prefix" is required'
    r = post(server, "/infill", {"input_prefix": "a", "input_suffix": "", "input_extra": [{"filename": "x"}]})
    assert r.status_code == 400 and "text" in r.json()["error"]["message"]
    r = post(server, "/infill", {"input_prefix": "a", "input_suffix": "", "input_extra": "nope"})
    assert r.status_code == 400
    # a model without FIM tokens: 501, and the message says why
    plain = ServerProcess(["--target", str(tiny.target), "--threads", str(THREADS), "-c", "512"], tmp_path / "h")
    try:
        r = post(plain, "/infill", VIM_FIM)
        assert r.status_code == 501 and r.json()["error"]["type"] == "not_supported_error"
        assert "FIM" in r.json()["error"]["message"]
    finally:
        assert plain.stop() == 0


def test_native_completion_and_raw_sse_framing(server):
    body = {"prompt": "the model", "n_predict": 10, "temperature": 0}
    whole = post(server, "/completion", body).json()
    assert whole["stop"] is True and whole["tokens_predicted"] == whole["timings"]["predicted_n"] <= 10
    with httpx.stream("POST", server.url + "/completion", json={**body, "stream": True}, timeout=60) as r:
        lines = [ln for ln in r.iter_lines()]
    events = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
    assert all(ln.startswith("data: ") or ln == "" for ln in lines)
    assert "".join(e["content"] for e in events) == whole["content"] and events[-1]["stop"] is True
    assert "data: [DONE]" not in lines  # llama-server's native stream ends without it
    with httpx.stream("POST", server.url + "/v1/chat/completions", timeout=60,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True}) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        oai_lines = [ln for ln in r.iter_lines() if ln]
    assert oai_lines[-1] == "data: [DONE]" and all(ln.startswith("data: ") for ln in oai_lines)


def test_information_endpoints(server):
    assert server.get("/health") == (200, {"status": "ok"})
    code, props = server.get("/props")
    assert code == 200 and props["total_slots"] == 4 and props["default_generation_settings"]["n_ctx"] == 1024
    toks = post(server, "/tokenize", {"content": "hello world"}).json()["tokens"]
    assert toks and post(server, "/detokenize", {"tokens": toks}).json()["content"].strip() == "hello world"
    pieces = post(server, "/tokenize", {"content": "hello", "with_pieces": True}).json()["tokens"]
    assert all(set(p) == {"id", "piece"} for p in pieces)
    code, text = server.get("/metrics")
    assert code == 200 and "llamacpp:tokens_predicted_total" in text
    assert "llamacpp:spec_decode_num_draft_tokens_total" in text and "localspec:draft_tokens_accepted_total" in text
    states = [ln for ln in text.splitlines() if ln.startswith("localspec:measurement{")]
    assert len(states) == 4 and sum(ln.endswith(" 1") for ln in states) == 1  # where the idle measuring stands
    assert props["localspec"]["measurement"]["state"] in ("pending", "measuring", "waiting", "done")


def test_bad_input_gets_an_error_json_and_the_server_stays_up(server):
    cases = [
        (b"{not json", 400, "not valid JSON"),
        (b"\xff\xfe", 400, "UTF-8"),
        (b"[1, 2]", 400, "JSON object"),
        ({"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, 400, '"temperature"'),
        ({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3}, 400, '"max_tokens"'),
        ({"messages": [{"role": "user", "content": "hi"}], "stop": [1, 2]}, 400, '"stop"'),
        ({"messages": "hi"}, 400, '"messages"'),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "text"),
        ({"messages": [{"role": "user", "content": "hi"}], "model": {"id": "x"}}, 400, '"model"'),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, 400, 'messages[0].role "wizard"'),
        (b'{"messages": [{"role": "user", "content": "cut \\ud83d"}]}', 400, "messages[0].content"),
        (b'{"a":' * 100000 + b'1' + b'}' * 100000, 400, "nested too deeply"),
        ({"messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": "x"}}, 400, '"logit_bias"'),
        ({"messages": [{"role": "user", "content": "hi"}], "spec": "sometimes"}, 400, '"spec"'),
    ]
    for body, status, words in cases:
        r = post(server, "/v1/chat/completions", body)
        assert r.status_code == status, (body, r.text)
        err = r.json()["error"]
        assert set(err) >= {"code", "message", "type"} and words in err["message"], (body, err)
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                              "some_future_field": {"x": 1}})
    assert r.status_code == 200  # unknown fields are ignored, never a 422
    assert server.get("/nowhere")[0] == 404 and server.get("/health")[0] == 200


def test_many_clients_each_get_their_own_answer_in_order(server):
    prompts = ["the cache", "a model token", "print hello world", "for line in file", "def parse csv"]

    def ask(p: str) -> str:
        return post(server, "/completion", {"prompt": p, "n_predict": 12, "temperature": 0}).json()["content"]

    alone = {p: ask(p) for p in prompts}
    finished, lock, threads = [], threading.Lock(), []
    results = {}

    def worker(p: str) -> None:
        r = post(server, "/completion", {"prompt": p, "n_predict": 12, "temperature": 0}).json()
        with lock:
            results[p] = r["content"]
            finished.append(p)

    for p in prompts * 2:
        threads.append(threading.Thread(target=worker, args=(p,)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(finished) == 2 * len(prompts)
    assert results == alone  # none lost, none answered with another's text


def test_a_client_that_hangs_up_cancels_its_generation(server):
    before = server.metric("llamacpp:tokens_predicted_total")
    with httpx.stream("POST", server.url + "/completion", timeout=60,
                      json={"prompt": "the", "n_predict": 600, "temperature": 0.8, "seed": 1, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # hang up after the first piece
    r = post(server, "/completion", {"prompt": "hello", "n_predict": 3, "temperature": 0})
    assert r.status_code == 200
    predicted = server.metric("llamacpp:tokens_predicted_total") - before
    assert predicted < 600  # the abandoned generation stopped long before its 600 tokens


def test_api_key(tiny, tmp_path):
    srv = ServerProcess(["--target", str(tiny.target), "--threads", str(THREADS), "-c", "512", "--api-key", "s3cret"],
                        tmp_path)
    try:
        assert srv.get("/health")[0] == 200  # public, as in llama-server
        code, body = srv.get("/props")
        assert code == 401 and body["error"]["type"] == "authentication_error"
        assert srv.get("/props", {"Authorization": "Bearer wrong"})[0] == 401
        assert srv.get("/props", {"Authorization": "Bearer s3cret"})[0] == 200
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="target", messages=[{"role": "user", "content": "hi"}])
        ok = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert ok.chat.completions.create(model="target", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    finally:
        assert srv.stop() == 0


def test_localspec_run_uses_a_running_server_with_the_same_pair(server, tiny):
    pair = ["--target", str(tiny.fim_target), "--draft", str(tiny.fim_draft)]
    served = server.metric("localspec:requests_total")
    r = run_cli(server, "run", *pair, "--threads", str(THREADS), "-c", "1024", "--temperature", "0", "-n", "8",
                "--json", "hello world")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"text", "tokens", "pair", "stats"} and out["tokens"] == out["stats"]["tokens"] > 0
    assert server.metric("localspec:requests_total") == served + 1  # answered by the server
    streamed = run_cli(server, "run", *pair, "--temperature", "0", "-n", "8", "--stats", "hello world")
    assert streamed.returncode == 0 and streamed.stdout == out["text"] + "\n" and "tokens = " in streamed.stderr
    assert server.metric("localspec:requests_total") == served + 2
    # --local, another pair, or another context size: in-process, the server is not asked
    for extra in (["--local"], ["-c", "512"]):
        r = run_cli(server, "run", *pair, "--threads", str(THREADS), "-n", "4", *extra, "hello")
        assert r.returncode == 0, r.stderr
    r = run_cli(server, "run", "--target", str(tiny.target), "--threads", str(THREADS), "-c", "512", "-n", "4", "hello")
    assert r.returncode == 0, r.stderr
    assert server.metric("localspec:requests_total") == served + 2
    # a server error is one line, like any other
    r = run_cli(server, "run", *pair, "-n", "4", "the " * 1200)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")


def test_serve_refuses_other_addresses_without_a_key(tiny, tmp_path):
    import subprocess
    import sys

    from harness.serverproc import ROOT

    r = subprocess.run([sys.executable, "-m", "localspec", "serve", "--target", str(tiny.target), "--host", "0.0.0.0"],
                       cwd=ROOT, capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "LOCALSPEC_HOME": str(tmp_path)})
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith("error: --host 0.0.0.0 would let other machines use the models; add --api-key")
    assert r.stderr.count("\n") == 1


def test_continue_llama_cpp_provider_request(server):
    """Continue's `llama.cpp` provider (core/llm/llms/LlamaCpp.ts): POST {apiBase}completion, streamed,
    `Authorization: Bearer undefined` when no key is set, the text read from each event's `content`."""
    body = {"prompt": "def parse the csv file", "stream": True, "n_predict": 16, "frequency_penalty": 0,
            "presence_penalty": 0, "min_p": 0.05, "mirostat": 0, "stop": ["\n\n"], "top_k": 40, "top_p": 0.95,
            "temperature": 0.01}
    with httpx.stream("POST", server.url + "/completion", json=body, timeout=60,
                      headers={"Authorization": "Bearer undefined"}) as r:
        assert r.status_code == 200
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    text = "".join(e["content"] for e in events if e.get("content"))
    assert events[-1]["stop"] is True and events[-1]["tokens_predicted"] <= 16 and "\n\n" not in text


def test_grammars_schemas_and_tools_on_the_tiny_model(server):
    """Constraints are enforced while decoding (the tiny model says whatever it likes otherwise); what
    cannot be honoured is a 400 that says why, never a silent drop."""
    r = post(server, "/completion", {"prompt": "the", "n_predict": 16, "json_schema": {"enum": ["fast", "slow"]}})
    assert r.status_code == 200 and json.loads(r.json()["content"]) in ("fast", "slow")
    r = post(server, "/completion", {"prompt": "the", "n_predict": 12, "grammar": 'root ::= ("yes" | "no") "!"'})
    assert r.status_code == 200 and r.json()["content"] in ("yes!", "no!")
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 24,
                                              "response_format": {"type": "json_schema", "json_schema": {
                                                  "name": "n", "schema": {"type": "integer"}}}})
    assert r.status_code == 200 and isinstance(json.loads(r.json()["choices"][0]["message"]["content"]), int)
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for body, words in [
        ({**chat, "tools": tools}, "no tools section"),  # the tiny model's template has none: never a silent drop
        ({**chat, "tools": tools, "tool_choice": {"type": "function", "function": {"name": "g"}}}, "not among the tools"),
        ({**chat, "tools": [{"type": "function"}]}, "tools[0]"),
        ({**chat, "response_format": {"type": "xml"}}, '"response_format"'),
        ({**chat, "grammar": "root ::= (", "max_tokens": 2}, "grammar could not be parsed"),
        ({**chat, "grammar": 'root ::= "a"', "json_schema": {"type": "integer"}}, "not several"),
        ({**chat, "json_schema": {"$ref": "https://example.com/x.json"}}, "only local references"),
    ]:
        r = post(server, "/v1/chat/completions", body)
        assert r.status_code == 400 and words in r.json()["error"]["message"], (body, r.text)
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "developer", "content": "be brief"},
                                                           {"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 200
