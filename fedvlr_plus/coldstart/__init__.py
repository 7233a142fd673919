"""Cold-start experiments: new items, new users, sparse users (``fedvlr-plus coldstart``).

- :mod:`.splits`: cold-item split with leave-one-out on the warm rest, cold-user hold-out, support/query;
- :mod:`.rules`: server-side ID rows for cold items from content (neighbours, ridge mapping, both);
- :mod:`.ridge`: the ridge map from content, its inputs kept for the refits of every seed;
- :mod:`.content`: the content-only reference ranker and a candidate-restricting scorer wrapper;
- :mod:`.experiment`: the item, user and sparsity experiments on the project's evaluator;
- :mod:`.study`: the study of one backbone (its typed options, the splits it loads, the models it trains);
- :mod:`.report`: CSV, Markdown and PNG report (the command is :mod:`fedvlr_plus.cli.coldstart`).
"""
