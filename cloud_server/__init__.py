"""SAKURA cloud server: template catalog, manifests and immutable KV shards over HTTP.

``create_app(ServerConfig(...))`` builds the aiohttp app; ``LocalStore`` is the default storage (``Store`` is the
interface an object store implements); ``publish_template`` is the precompute glue; ``sakura serve`` /
``sakura precompute`` are the commands (``sakura bench serve``, its load test, is a tool: ``sakura_tools.infra``).
"""

from .app import create_app
from .config import ServerConfig
from .precompute import publish_template
from .store import LocalStore, Store

__all__ = ["LocalStore", "ServerConfig", "Store", "create_app", "publish_template"]
