"""The learned ground contact (the hybrid graph-network paper): the robot's graph
(:mod:`~pipeline.learned.graph`), the network (:mod:`~pipeline.learned.network`), the hybrid
engine (:mod:`~pipeline.learned.engine`), its training data (:mod:`~pipeline.learned.data`,
:mod:`~pipeline.learned.simulated`) and training (:mod:`~pipeline.learned.training`)."""
