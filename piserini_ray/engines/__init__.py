"""The engines that run a prepared run's queries: their contract (`contract`: `Engine`,
`PreparedRun`, `RunSummary`, `Log`), the in-process engine (`local`, asyncio) and the Ray
engine (`ray`: replicas, the scheduler, the driver's services, served models).

The pipeline chooses one (`piserini_ray.pipeline.make_engine`); nothing below the pipeline
imports an engine."""
