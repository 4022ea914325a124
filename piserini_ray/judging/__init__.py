"""The LLM judge: its templates (`templates`: the prompt and how a reply is read) and the grader
(`grader`: one verdict per query per judge model, in calls or in a provider's batches, written as
they come so that judging resumes).

Judging on Ray (`engines.ray.judging`: the verdicts of a finished run on the cluster;
`engines.ray.judge_alongside`: verdicts while the queries run) is Ray code and lives in that
engine; the judge's settings (`config.judging`) live with the other configs, and the offline
model's own judging policy with the offline model (`offline.judge_policy`)."""
