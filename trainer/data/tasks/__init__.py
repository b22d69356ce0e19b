"""Synthetic length-generalisation tasks: generators (`sequence`, `needles`), their registry (`TASKS`) and the
builder that turns them into token-exact examples hidden in corpus text (`build`)."""
