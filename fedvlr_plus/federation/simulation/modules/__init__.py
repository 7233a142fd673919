"""The batched engine for backbones that are plain torch modules (RecBole models): clients trained as
lanes of one functional call, fused scoring, BPR and dropout special cases."""
