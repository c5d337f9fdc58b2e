"""The web configuration in force, and its reloading when the files change or on SIGHUP.

A reload that fails leaves the last good configuration in force and logs one line.
A reload may not weaken the server silently: a file that is now empty (a truncated
write, a Secret being updated) or that drops basic auth or TLS is refused while the
running configuration has them; turning them off takes a restart.
"""

from __future__ import annotations

import asyncio
import logging
import ssl

from exporter.http.webconfig.auth import Authenticator
from exporter.http.webconfig.parse import Loaded, WebConfigError, fingerprint, load
from exporter.http.webconfig.tls import tune
from exporter.runtime.signals import ReloadStatus

log = logging.getLogger(__name__)

POLL_S = 5.0
"""How often the file and the files it names are checked for changes, seconds."""
KIND = "web_config"


class WebState:
    """The configuration in force, and what swaps it when the files change.

    The listening socket keeps the SSLContext it was created with (``context``). New
    configurations are built into fresh contexts; a server-name callback, which OpenSSL
    calls for every handshake (with or without SNI), moves each new connection onto the
    newest one, which supplies the certificate and the client CA store. The settings a
    connection copies from the listening context before that callback (versions, client
    verification, ciphers) are written onto the listening context as well.
    """

    def __init__(self, loaded: Loaded, status: ReloadStatus | None = None) -> None:
        self.config = loaded.config
        self.context = loaded.context
        self._current = loaded.context
        self._seen = loaded.fingerprint
        self.auth = Authenticator()
        self.status = status if status is not None else ReloadStatus()
        self.status.record(KIND, True)
        if self.context is not None:
            self.context.sni_callback = self._select

    def _select(self, conn: ssl.SSLObject, _name: str | None, ctx: ssl.SSLContext) -> None:
        if self._current is not None and self._current is not ctx:
            conn.context = self._current

    async def reload(self, force: bool = False) -> bool:
        """Reload when a watched file changed (or ``force``); True when a new config is in force."""
        loop = asyncio.get_running_loop()
        if not force:
            watched = [p for p, _ in self._seen]
            if await loop.run_in_executor(None, fingerprint, watched) == self._seen:
                return False
        try:
            loaded = await loop.run_in_executor(None, load, self.config.path)
        except WebConfigError as e:
            if e.fingerprint != self._seen:  # once per change of the files, not every poll
                log.error("%s; still serving with the last good web config", e)
            self._seen = e.fingerprint  # retried when one of the files it read changes
            self.status.record(KIND, False)
            return False
        self._seen = loaded.fingerprint
        refusal = self._weakens(loaded)
        if refusal:
            log.error(
                "web config %s: %s; still serving with the last good web config",
                self.config.path,
                refusal,
            )
            self.status.record(KIND, False)
            return False
        self.apply(loaded)
        self.status.record(KIND, True)
        log.info("web config %s reloaded: %s", self.config.path, self.config.describe())
        return True

    def _weakens(self, loaded: Loaded) -> str:
        """Why ``loaded`` may not replace the config in force ('' when it may)."""
        new, old = loaded.config, self.config
        if new.empty and (old.users or old.tls is not None):
            return "the file is now empty (a partial write?); restart to serve without it"
        if (loaded.context is None) != (self.context is None):
            return "switching between HTTP and HTTPS needs a restart"
        if old.users and not new.users:
            return "turning basic auth off needs a restart"
        return ""

    def apply(self, loaded: Loaded) -> None:
        if loaded.context is not None and self.context is not None:
            assert loaded.config.tls is not None
            tune(self.context, loaded.config.tls)
            self._current = loaded.context
        self.config = loaded.config

    async def authorized(self, header: str | None) -> bool | None:
        """Whether an Authorization header carries a configured user and its password;
        None when too many checks are already in progress (answer 503)."""
        return await self.auth.authorized(self.config.users, header)

    def close(self) -> None:
        self.auth.close()
