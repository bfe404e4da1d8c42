"""Speculative decoding itself: the one-screen loop (`loop.speculative_decode`), what proposes drafts (`drafters`,
`ngram`, `draft`), how many tokens a round drafts (`policy`), the accept/resample math and logit bias (`sampling`),
and grammars on the target's rows beside it (`constraints`). Nothing here loads a model or knows about lanes."""
