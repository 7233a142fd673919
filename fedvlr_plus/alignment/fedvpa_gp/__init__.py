"""FedVPA-GP: federated variational preference alignment with a Gumbel-Softmax mixture prior, against
FedVPL and a monolithic reward. Entry point: :mod:`.method`."""
