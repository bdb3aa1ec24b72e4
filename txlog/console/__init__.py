"""The operators' web console (``txlog console``): the cluster, its topics,
transactions and consumer groups, server-rendered from what the SDK's Admin
answers (``views.py`` shapes it, ``app.py`` serves it)."""
