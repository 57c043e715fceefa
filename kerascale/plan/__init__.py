"""Plan: pure rules from (hardware, options, model facts, data facts) to one
`Plan` (strategy, precision, batch, accumulation, learning rate, data changes),
each decision with its reason. Nothing here touches TensorFlow state."""
