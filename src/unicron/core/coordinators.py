"""The coordinator addresses an agent or a client was given (``--coordinator URL[,URL...]``):
with several coordinators on etcd, one leads and the standbys keep their ports closed until they
do, so a request that finds no listener (or a leader that died) goes on to the next address.
Pure: the caller makes the requests and says which failed."""

from __future__ import annotations

from dataclasses import dataclass, field

from unicron.core.errors import UsageError


def parse_coordinators(spec: str, flag: str = "--coordinator") -> list[str]:
    urls = [u.strip().rstrip("/") for u in spec.split(",") if u.strip()]
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise UsageError(f"{flag} {url!r}: write http(s)://host:port, several separated by commas")
    if not urls:
        raise UsageError(f"{flag}: give at least one http(s)://host:port")
    return urls


@dataclass
class Coordinators:
    urls: list[str]
    index: int = 0
    tried: int = field(default=0)  # addresses that failed since one last answered

    @classmethod
    def of(cls, spec: str) -> Coordinators:
        return cls(parse_coordinators(spec))

    @property
    def current(self) -> str:
        return self.urls[self.index]

    def answered(self) -> None:
        self.tried = 0

    def failed(self) -> bool:
        """The current address did not answer: move to the next. True when every address failed
        in turn since one last answered (then the caller backs off before the next round)."""
        self.index = (self.index + 1) % len(self.urls)
        self.tried += 1
        if self.tried >= len(self.urls):
            self.tried = 0
            return True
        return False

    def __str__(self) -> str:
        return ",".join(self.urls)
