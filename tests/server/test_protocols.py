"""Anthropic Messages, OpenAI Responses and Ollama's API on a real `localspec serve` (a tiny model whose
template renders tools), driven by the published SDKs (`anthropic`, `openai`, `ollama`) and by raw HTTP
for the event order: every protocol's text equals the chat-completions text for the same greedy request."""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai
import pytest
from conftest import THREADS

from harness.serverproc import ServerProcess
from harness.tinygguf import CHATML, build_tiny_model

# ChatML with a tools section and Qwen's <tool_call> blocks, as the real pair's template renders them
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\ntools: {% for t in tools %}{{ t | tojson }}{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
assert CHATML  # the plain template the other tiny models carry
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo"]}},
           "required": ["city"], "additionalProperties": False}
ASK = "the draft model"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("tools-gguf")
    build_tiny_model(d / "tools.gguf", seed=0, chat_template=TOOLS_TEMPLATE, fim=True)
    build_tiny_model(d / "tools-draft.gguf", seed=0, perturb=0.1, chat_template=TOOLS_TEMPLATE, fim=True)
    srv = ServerProcess(["--target", str(d / "tools.gguf"), "--draft", str(d / "tools-draft.gguf"),
                         "--threads", str(THREADS), "-c", "1024", "--temperature", "0"],
                        tmp_path_factory.mktemp("serve-home"))
    yield srv
    assert srv.stop() == 0, srv.output()
    assert "Traceback" not in srv.output()


def post(server, path: str, body, **kw) -> httpx.Response:
    content = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=content, headers={"Content-Type": "application/json"}, timeout=120, **kw)


def sse_events(text: str) -> list[tuple[str, dict]]:
    """(event name, data) for each SSE event of a body."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


def chat_text(server, max_tokens: int = 12) -> str:
    r = post(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": ASK}], "max_tokens": max_tokens})
    return r.json()["choices"][0]["message"]["content"]


# --- Anthropic Messages ----------------------------------------------------------------------------
def test_anthropic_sdk_text_streamed_and_not(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    expected = chat_text(server)
    m = client.messages.create(model="claude-sonnet-5", max_tokens=12, messages=[{"role": "user", "content": ASK}])
    assert m.type == "message" and m.role == "assistant" and m.content[0].type == "text"
    assert m.content[0].text == expected and m.stop_reason in ("end_turn", "max_tokens")
    assert m.usage.output_tokens > 0 and m.usage.input_tokens + m.usage.cache_read_input_tokens > 0
    assert "draft_n" in m.model_extra["timings"] or m.model_extra["localspec"]["target_passes"] > 0
    with client.messages.stream(model="x", max_tokens=12, messages=[{"role": "user", "content": ASK}]) as s:
        streamed = "".join(s.text_stream)
        final = s.get_final_message()
    assert streamed == expected and final.content[0].text == expected
    assert client.messages.count_tokens(model="x", messages=[{"role": "user", "content": ASK}]).input_tokens > 3


def test_anthropic_event_order_and_tool_use(server):
    body = {"model": "x", "max_tokens": 200, "stream": True, "system": [{"type": "text", "text": "be brief"}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "weather?"}]}],
            "tools": [{"name": "weather", "description": "the weather", "input_schema": WEATHER}],
            "tool_choice": {"type": "any"}}
    r = post(server, "/v1/messages", body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    names = [e for e, _ in events]
    assert names[:2] == ["message_start", "ping"] and names[-2:] == ["message_delta", "message_stop"]
    assert all(e == d["type"] for e, d in events)
    starts = [d for e, d in events if e == "content_block_start"]
    assert starts and starts[0]["content_block"]["type"] == "tool_use" and starts[0]["content_block"]["name"] == "weather"
    args = "".join(d["delta"]["partial_json"] for e, d in events if e == "content_block_delta")
    assert json.loads(args)["city"] in ("Paris", "Oslo")
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    # the tool's result goes back as a tool_result block: the conversation continues
    call = starts[0]["content_block"]
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    m = client.messages.create(model="x", max_tokens=8, tools=body["tools"], messages=[
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": call["id"], "name": "weather",
                                           "input": json.loads(args)}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call["id"], "content": "sunny"}]}])
    assert m.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_anthropic_stop_sequences_and_errors(server):
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0)
    text = chat_text(server, 12)
    word = text.split()[1] if len(text.split()) > 1 else text.split()[0]
    m = client.messages.create(model="x", max_tokens=12, stop_sequences=[word], messages=[{"role": "user", "content": ASK}])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word and word not in m.content[0].text
    with pytest.raises(anthropic.BadRequestError, match="max_tokens"):
        client.messages.create(model="x", max_tokens=0, messages=[{"role": "user", "content": "hi"}])
    for body, words in [({"messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
                        ({"max_tokens": 4, "messages": [{"role": "robot", "content": "hi"}]}, "role"),
                        ({"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "image"}]}]}, "image"),
                        ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                          "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "server tools"),
                        ({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": "x"},
                         "stop_sequences")]:
        r = post(server, "/v1/messages", body)
        assert r.status_code == 400 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "invalid_request_error" and words in r.json()["error"]["message"]
    assert post(server, "/v1/messages", b"{not json").json()["error"]["type"] == "invalid_request_error"
    assert httpx.head(server.url + "/").status_code == 200


# --- OpenAI Responses ------------------------------------------------------------------------------
def test_responses_with_the_openai_package(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    expected = chat_text(server)
    r = client.responses.create(model="gpt-5", input=ASK, max_output_tokens=12)
    assert r.output_text == expected and r.usage.output_tokens > 0 and r.status in ("completed", "incomplete")
    with client.responses.stream(model="x", input=[{"role": "user", "content": ASK}], max_output_tokens=12) as s:
        events = list(s)
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    # the length limit ends it as OpenAI does: response.incomplete (max_output_tokens), the text whole
    assert events[-1].type == "response.incomplete" and events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert "".join(deltas) == expected and events[-1].response.output_text == expected
    # previous_response_id continues the conversation this server answered
    follow = client.responses.create(model="x", previous_response_id=r.id, input="more", max_output_tokens=4)
    assert follow.previous_response_id == r.id and follow.usage.input_tokens > r.usage.input_tokens
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
        client.responses.create(model="x", previous_response_id="resp_unknown", input="x", max_output_tokens=2)
    n = client.responses.input_tokens.count(model="x", input=ASK) if hasattr(client.responses, "input_tokens") else None
    assert n is None or n.input_tokens > 3


def test_responses_function_call_round_trip_and_event_order(server):
    tools = [{"type": "function", "name": "weather", "description": "the weather", "parameters": WEATHER}]
    r = post(server, "/v1/responses", {"model": "x", "input": "weather?", "tools": tools, "tool_choice": "required",
                                       "stream": True, "max_output_tokens": 200})
    events = sse_events(r.text)
    kinds = [d["type"] for _, d in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
    assert "response.function_call_arguments.done" in kinds
    item = next(d["item"] for _, d in events if d["type"] == "response.output_item.done")
    assert item["type"] == "function_call" and json.loads(item["arguments"])["city"] in ("Paris", "Oslo")
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    out = client.responses.create(model="x", tools=tools, max_output_tokens=6, input=[
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": item["call_id"], "name": "weather", "arguments": item["arguments"]},
        {"type": "function_call_output", "call_id": item["call_id"], "output": "sunny"}])
    assert out.status in ("completed", "incomplete")
    # hosted tools (Codex sends web_search) are left out, as llama-server does; the function tools stay
    r = post(server, "/v1/responses", {"input": "weather?", "tools": [{"type": "web_search"}, *tools],
                                       "tool_choice": "required", "max_output_tokens": 200})
    assert r.status_code == 200 and r.json()["output"][-1]["type"] == "function_call"
    bad = post(server, "/v1/responses", {"input": "x", "tools": [{"name": "f"}]})
    assert bad.status_code == 400 and "tools[0]" in bad.json()["error"]["message"]
    assert post(server, "/v1/responses", {"model": "x"}).status_code == 400


# --- Ollama ----------------------------------------------------------------------------------------
def test_ollama_library_chat_generate_and_models(server):
    client = ollama.Client(host=server.url)
    expected = chat_text(server)
    r = client.chat(model="qwen2.5-coder:1.5b", messages=[{"role": "user", "content": ASK}],
                    options={"num_predict": 12, "temperature": 0})
    assert r.message.content == expected and r.done and r.eval_count > 0 and r.eval_duration > 0
    streamed = list(client.chat(model="x", messages=[{"role": "user", "content": ASK}], stream=True,
                                options={"num_predict": 12}))
    assert "".join(p.message.content for p in streamed) == expected and streamed[-1].done
    g = client.generate(model="x", prompt="def read", suffix="return data", options={"num_predict": 6})
    assert g.done and g.done_reason in ("stop", "length")
    j = client.chat(model="x", messages=[{"role": "user", "content": "a"}], options={"num_predict": 20},
                    format={"type": "string", "enum": ["fast", "slow"]})
    assert json.loads(j.message.content) in ("fast", "slow")
    t = client.chat(model="x", messages=[{"role": "user", "content": "weather?"}], options={"num_predict": 200},
                    tools=[{"type": "function", "function": {"name": "weather", "parameters": WEATHER}}])
    assert t.done
    assert client.list().models and client.ps().models[0].context_length == 1024
    shown = client.show("x")
    assert shown.capabilities == ["completion", "tools", "insert"]
    assert any(k.endswith("context_length") for k in shown.modelinfo)
    assert httpx.get(server.url + "/").text == "Ollama is running"
    assert httpx.get(server.url + "/api/version").json()["version"][0].isdigit()
    with pytest.raises(ollama.ResponseError, match="localspec pull"):
        client.pull("llama3")
    r = post(server, "/api/chat", {"model": "x", "messages": "hi"})
    assert r.status_code == 400 and "messages" in r.json()["error"]


def test_ollama_ndjson_streaming_by_default(server):
    r = post(server, "/api/generate", {"model": "x", "prompt": ASK, "options": {"num_predict": 8}})
    assert r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.text.splitlines()]
    assert not lines[0]["done"] and lines[-1]["done"] and "draft_n" in lines[-1]
    assert lines[-1]["eval_count"] == 8 and lines[-1]["done_reason"] == "length"


def test_bad_input_is_a_400_in_each_protocols_shape(server):
    """Wrong types and unsupported features: a 400 that names the field, in the protocol's own error shape;
    the server stays up."""
    msgs = [{"role": "user", "content": "hi"}]
    cases = [
        ("/v1/messages", {"max_tokens": "4", "messages": msgs}, "max_tokens"),
        ("/v1/messages", {"max_tokens": 4, "messages": msgs, "tool_choice": {"type": "maybe"}}, "tool_choice"),
        ("/v1/messages", {"max_tokens": 4, "messages": msgs, "temperature": "hot"}, "temperature"),
        ("/v1/messages/count_tokens", {"messages": "hi"}, "messages"),
        ("/v1/responses", {"input": 5}, "input"),
        ("/v1/responses", {"input": [{"type": "computer_call"}]}, "computer_call"),
        ("/v1/responses", {"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ("/v1/responses", {"input": "x", "text": {"format": {"type": "xml"}}}, "response_format"),
        ("/api/chat", {"messages": [{"role": "robot", "content": "x"}]}, "role"),
        ("/api/chat", {"messages": msgs, "options": {"num_predict": "many"}}, "num_predict"),
        ("/api/chat", {"messages": msgs, "format": 5}, "format"),
        ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "images"),
        ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, "template"),
    ]
    for path, body, words in cases:
        r = post(server, path, body)
        assert r.status_code == 400, (path, body, r.text)
        err = r.json()["error"]
        message = err if isinstance(err, str) else err["message"]
        assert words in message, (path, body, message)
        if path.startswith("/v1/messages"):
            assert r.json()["type"] == "error" and err["type"] == "invalid_request_error"
    assert post(server, "/api/create", {"model": "llama3"}).status_code == 501
    r = post(server, "/api/pull", {"model": "llama3"})
    assert r.status_code == 404 and "`localspec pull`" in r.json()["error"]
    assert post(server, "/api/embed", {"model": "x", "input": "hi"}).status_code == 501
    assert httpx.get(server.url + "/health").status_code == 200
