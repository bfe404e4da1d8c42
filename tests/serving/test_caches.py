"""A server's saved prompts and n-gram memory: in memory, on disk across a restart, damaged entries dropped."""

from __future__ import annotations

import pytest
from conftest import THREADS

from localspec.config import GenConfig, LoadConfig
from localspec.serving.engine import ServingEngine


def test_a_repeated_request_drafts_from_the_earlier_answer(fim_engine):
    e = fim_engine
    e.remember_generations = True
    try:
        # sampled (a greedy request drafts from its own text alone: tests/backend/test_exact.py), but one-hot (top-k 1)
        cfg = GenConfig(temperature=0.7, top_k=1, seed=1, spec="on", drafter="ngram", draft_max=4, max_tokens=40)
        prompt = e.prompt_tokens("hello world")
        first = [c.token for c in e.generate(prompt, cfg) if c.token is not None]
        second = [c.token for c in e.generate(prompt, cfg) if c.token is not None]
        st = e.last_stats
        assert second == first and st.accepted > 0 and st.prompt_eval_tokens <= 1  # drafted from memory, cached
    finally:
        e.remember_generations = False


def test_a_long_prompt_outlives_the_process_on_disk(tiny, tmp_path):
    """A prompt evaluated once is restored from disk by a new engine (a restarted server), verified first:
    a corrupt entry is deleted and evaluated again, never loaded; another pair's entries are not seen."""
    from localspec.serving.caches.promptcache import PromptCache
    from localspec.serving.caches.promptdisk import SAVE_MIN, DiskPrompts, pair_key

    load = LoadConfig(n_ctx=4096, n_threads=THREADS, n_threads_batch=THREADS)
    prompt = [(i * 7) % 200 + 3 for i in range(SAVE_MIN + 300)]
    key = pair_key(str(tiny.fim_target))

    warnings = []

    def fresh_engine():
        e = ServingEngine(tiny.fim_target, None, load)
        e.prompt_cache = PromptCache(e.target, 64 << 20, disk=DiskPrompts(tmp_path, key, 256 << 20, warnings.append))
        return e

    def evaluated(e, tokens) -> int:
        st = e.prefill(tokens)
        return st.prompt_eval_tokens

    e = fresh_engine()
    assert evaluated(e, prompt) == len(prompt) - 1
    e.prompt_cache.persist(len(prompt))
    e.prompt_cache.disk.wait()
    e.close()
    files = sorted(p.suffix for p in tmp_path.rglob("*") if p.is_file())
    assert files == [".json", ".kv"]
    e = fresh_engine()  # "after a restart": a longer prompt with the same start evaluates only its new end
    longer = prompt + [5, 6, 7, 8]
    assert evaluated(e, longer) == 4 and e.last_stats.cache_restored
    e.close()
    kv = next(tmp_path.rglob("*.kv"))
    kv.write_bytes(b"\0" * kv.stat().st_size)  # same size, wrong bytes: the checksum catches it
    e = fresh_engine()
    assert evaluated(e, longer) == len(longer) - 1
    assert not list(tmp_path.rglob("*.kv"))  # the corrupt entry is gone, and said so in one line
    assert len(warnings) == 1 and warnings[0].startswith(f"dropping the saved prompt {kv} (truncated or damaged)")
    e.close()
    other = DiskPrompts(tmp_path, "another-model.gguf", 256 << 20)
    assert other.best(prompt) == (None, 0)


@pytest.mark.parametrize("meta", ["[]", "null", "7", '"text"', "{not json", '{"format": 1}'])
def test_a_saved_prompt_entry_that_is_not_one_is_dropped_with_a_warning(tmp_path, meta):
    from localspec.serving.caches.promptdisk import DiskPrompts

    warnings = []
    disk = DiskPrompts(tmp_path, "model.gguf", 256 << 20, warnings.append)
    disk.dir.mkdir(parents=True)
    (disk.dir / "abc.json").write_text(meta)
    (disk.dir / "abc.kv").write_bytes(b"\0" * 16)
    assert disk.best([1, 2, 3]) == (None, 0)
    assert not list(disk.dir.iterdir())
    assert len(warnings) == 1 and warnings[0].startswith(f"dropping the saved prompt {disk.dir / 'abc.json'} (")
    assert warnings[0].endswith("); its prompt is evaluated again")


