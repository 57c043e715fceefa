"""What the TensorFlow backend does to carry out a plan: its strategies
(`strategy`), and a cluster through TensorFlow's own multi-worker engine
(`cluster`, `resolvers`). The JAX backend's counterpart is
`kerascale.apply.jax`; `kerascale.apply.strategy` picks one of the two."""
