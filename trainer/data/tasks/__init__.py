"""Synthetic length-generalisation tasks: generators (`sequence`, `needles`), their registry (`TASKS`, in
`trainer.data.tasks.registry`) and the builder that turns them into token-exact examples hidden in corpus text
(`build`)."""
