"""Any RecBole general recommender as a federated backbone: the adapter (:mod:`.backbone`), RecBole's
data and evaluation bridges, the model catalogue, and NeuMF's fast scoring."""
