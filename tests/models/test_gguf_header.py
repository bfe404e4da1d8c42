"""The header-only GGUF reader and the draft/target check built on it (no model is loaded)."""

from __future__ import annotations

import io
import struct

import pytest
from hub_helpers import HubEmulator, gguf_kv_end, write_padded_gguf

from harness.tinygguf import tiny_vocab
from localspec.errors import LocalspecError
from localspec.models.check import check_pair_files, vocab_info_from_header
from localspec.models.gguf_header import (
    GgufHeaderError,
    SkippedArray,
    read_header,
    read_header_file,
)

TOKENS, _, _ = tiny_vocab()
FIRST_WORD_ID = 5 + 256  # after 5 control tokens and 256 byte tokens: "▁the" (other_vocab: "▁zzthe")


def test_header_fields_of_a_tiny_model(tiny):
    header = read_header_file(tiny.target)
    assert header.version == 3
    assert header.architecture == "llama"
    assert header.get("general.name") == "tiny-llama-seed0-perturb0.0"
    assert header.get("tokenizer.ggml.tokens") == TOKENS
    assert header.get("tokenizer.ggml.scores") == SkippedArray(item_type=6, count=len(TOKENS))
    assert header.get("tokenizer.chat_template").startswith("{% for message in messages %}")
    assert header.header_bytes == gguf_kv_end(tiny.target)


def test_every_key_agrees_with_the_gguf_package_reader(tiny):
    import gguf

    reference = gguf.GGUFReader(str(tiny.target))
    ours = read_header_file(tiny.target).metadata
    keys = [k for k in reference.fields if not k.startswith("GGUF.")]
    assert list(ours) == keys
    for key in keys:
        field = reference.fields[key]
        if field.types[0] == gguf.GGUFValueType.ARRAY:
            assert len(field.data) == (len(ours[key]) if isinstance(ours[key], list) else ours[key].count)
        else:
            assert ours[key] == field.contents(), key


def test_vocab_info_from_path_and_from_file_object(tiny):
    info = vocab_info_from_header(tiny.target)
    assert (info.vocab_type, info.n_tokens, info.bos, info.eos, info.add_bos) == ("spm", len(TOKENS), 1, 4, True)
    assert info.text(FIRST_WORD_ID) == "▁the"
    with open(tiny.target, "rb") as f:
        assert vocab_info_from_header(f).token_text == TOKENS


@pytest.mark.parametrize("draft, compatible", [("same", True), ("perturbed", True), ("bad", True),
                                               ("no_template", True), ("other_vocab", False)])
def test_pair_check_on_tiny_models(tiny, draft, compatible):
    result = check_pair_files(str(tiny.target), str(getattr(tiny, draft)))
    assert result.compatible is compatible
    if compatible:
        assert result.mismatch is None
    else:
        assert result.mismatch == f"token {FIRST_WORD_ID} differs: target '▁the', draft '▁zzthe'"


def test_reads_only_the_header_of_a_big_local_file(tmp_path):
    big = write_padded_gguf(tmp_path / "padded.gguf", pad_bytes=16 * 1024 * 1024)
    header = read_header_file(big)
    assert header.bytes_read <= 256 * 1024  # one first read; the file is 16 MB
    assert header.bytes_read < big.stat().st_size / 50


def test_remote_check_reads_headers_through_range_requests(tmp_path, monkeypatch):
    """The Hub is a local HTTP server here; huggingface_hub's HfFileSystem turns reads into ranges."""
    import huggingface_hub.constants

    target = write_padded_gguf(tmp_path / "target.gguf", pad_bytes=16 * 1024 * 1024)
    draft = write_padded_gguf(tmp_path / "draft.gguf", pad_bytes=8 * 1024 * 1024)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # read once at its import
    with HubEmulator("org/tiny-GGUF", {"target.gguf": target, "draft.gguf": draft}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        result = check_pair_files("org/tiny-GGUF/target.gguf", "org/tiny-GGUF/draft.gguf")
    assert result.compatible is True
    assert result.target.where == "org/tiny-GGUF/target.gguf"
    total = target.stat().st_size + draft.stat().st_size
    ranges = [r for method, path, r in hub.requests if "/resolve/" in path]
    assert ranges == ["bytes=0-262143", "bytes=0-262143"]
    assert hub.body_bytes == 2 * 256 * 1024
    assert hub.body_bytes < total / 40  # 512 KiB of 25 MB


def test_remote_ref_with_hub_offline_is_a_clear_error():
    with pytest.raises(LocalspecError, match="not in the local Hugging Face cache and HF_HUB_OFFLINE=1"):
        check_pair_files("org/missing-GGUF/model.gguf", None)


def _bytes_of(tiny) -> bytes:
    return tiny.target.read_bytes()


def test_not_a_gguf(tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}" + b"\0" * 100)
    with pytest.raises(GgufHeaderError, match="is not a GGUF model file .*pass a .gguf file"):
        read_header_file(p)


def test_empty_and_truncated_files(tmp_path, tiny):
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GgufHeaderError, match="empty or shorter than 4 bytes"):
        read_header_file(empty)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(_bytes_of(tiny)[:3000])  # ends inside the token list
    with pytest.raises(GgufHeaderError, match=r"is truncated: it ends inside its header \(at byte 3000\); download it again"):
        read_header_file(cut)


def test_unsupported_version(tmp_path, tiny):
    data = bytearray(_bytes_of(tiny))
    data[4:8] = struct.pack("<I", 1)
    p = tmp_path / "v1.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(GgufHeaderError, match="GGUF version 1; only versions 2 and 3"):
        read_header_file(p)


def _write_gguf(path, arch: str, **kv):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in kv.items():
        writer.add_string(key, value)
    writer.add_tensor("x.weight", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("arch, kv, message", [
    ("clip", {}, "is a multimodal projector \\(mmproj\\), not a language model"),
    ("llama", {"general.type": "adapter", "adapter.type": "lora"}, "is a lora adapter, not a language model"),
    ("llama", {}, "is a GGUF llama file without a tokenizer"),
])
def test_a_gguf_that_is_not_a_language_model(tmp_path, arch, kv, message):
    p = _write_gguf(tmp_path / "x.gguf", arch, **kv)
    with pytest.raises(GgufHeaderError, match=message):
        vocab_info_from_header(p)


def test_llama_cpp_defaults_for_absent_tokenizer_keys(tmp_path):
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(tmp_path / "bare.gguf"), "gpt2")
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "c"])
    writer.add_tensor("x.weight", np.zeros(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = vocab_info_from_header(tmp_path / "bare.gguf")
    assert (info.vocab_type, info.bos, info.eos, info.add_bos, info.n_tokens) == ("bpe", 11, 11, False, 3)


def test_reader_needs_only_read_calls(tiny):
    """A forward-only stream (no seek, no tell) is enough: that is all a remote file has to offer."""

    class ForwardOnly(io.RawIOBase):
        def __init__(self, data):
            self.src = io.BytesIO(data)

        def readable(self):
            return True

        def readinto(self, b):
            chunk = self.src.read(min(len(b), 1000))  # short reads, like a network stream
            b[:len(chunk)] = chunk
            return len(chunk)

    header = read_header(ForwardOnly(_bytes_of(tiny)), "stream")
    assert header.get("tokenizer.ggml.tokens") == TOKENS
