"""What the tests and the benchmarks share: synthetic histories (`histories`, numpy only) and a fake
OpenAI/Anthropic upstream served in a thread (`fake_upstream`, needs the serve extra)."""
