"""The admin socket's methods: what an operator may ask, and only an operator.

They cross tenants (see :mod:`openwop_memory.service.inspector`), so they are served on a
second socket (``admin_socket``, mode 0600: only the service's own user, and root, can
connect) by a dispatcher of their own. The workers' socket does not know these names: there
they are ``method_not_found``, like any other unknown method.

- ``admin.runs {limit?}``: stored runs, the most recently touched first.
- ``admin.run {runId}``: what the run's snapshot sees, scope by scope, as its list would.
- ``admin.diff {from, to}``: what changed between two runs' snapshots of one tenant.
- ``admin.scopes {tenant}``: the tenant's scopes and their live entries.
- ``admin.entry {id}``: one entry by id, whatever its tenant.
- ``admin.backup {path}``: a consistent, checked copy of a SQLite database in a new file.
- ``admin.forget {tenant, subject}``: remove the tenant's entries tagged ``subject:<subject>``.
"""

from __future__ import annotations

from typing import Annotated

from openwop_memory_client.wire import CONTROL_FREE, Name, RunId
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from ..service.inspector import Inspector
from .methods import AnyMethod, Method

# The access log's one-line budget is no concern here: an operator asks a few at a time.
MAX_RUNS = 10_000


class _AdminParams(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class RunsParams(_AdminParams):
    limit: int = Field(100, ge=1, le=MAX_RUNS)


class RunParams(_AdminParams):
    runId: RunId


class DiffParams(_AdminParams):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True, populate_by_name=True)

    first: RunId = Field(alias="from")
    second: RunId = Field(alias="to")


class ScopesParams(_AdminParams):
    tenant: Name


class EntryParams(_AdminParams):
    id: Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=CONTROL_FREE)]


class BackupParams(_AdminParams):
    path: Annotated[str, StringConstraints(min_length=1, max_length=4096)]


class ForgetParams(_AdminParams):
    tenant: Name
    subject: Name  # "subject:" + 128 characters stays within a tag's 256


ADMIN_METHODS: dict[str, AnyMethod[Inspector]] = {
    "admin.runs": Method(RunsParams, lambda i, p: i.runs(p.limit)),
    "admin.run": Method(RunParams, lambda i, p: i.run(p.runId)),
    "admin.diff": Method(DiffParams, lambda i, p: i.diff(p.first, p.second)),
    "admin.scopes": Method(ScopesParams, lambda i, p: i.scopes(p.tenant)),
    "admin.entry": Method(EntryParams, lambda i, p: i.entry(p.id)),
    "admin.backup": Method(BackupParams, lambda i, p: i.backup(p.path)),
    "admin.forget": Method(ForgetParams, lambda i, p: i.forget(p.tenant, p.subject)),
}
