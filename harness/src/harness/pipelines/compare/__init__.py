"""``miniframes-compare``: the seed chapter's two comparison tables (training strategies, inference engines),
measured on one model: memory per rank by kind, communication per step, step time, lines of code, scale."""
