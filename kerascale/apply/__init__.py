"""Apply: one path from (model, data, plan) to what trains. `session` owns
every change made on the way and undoes it on every exit; the other modules
are the steps it takes (strategy, model re-creation, accumulation, data,
cluster) and the Keras compatibility fixes they need."""
