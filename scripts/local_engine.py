"""The local AWS engine: moto's server, with DynamoDB requests applied one at a time.

moto serves requests on parallel threads without a lock around the table, so two conditional
writes to one item can both pass their condition, where DynamoDB applies them atomically. One
lock around DynamoDB requests restores that guarantee; SQS requests (long polls among them)
keep running concurrently.

    python scripts/local_engine.py [-H 127.0.0.1] [-p 4566]
"""

import argparse
import threading

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from moto.server import MotoRequestHandler
from werkzeug.serving import run_simple


class OneDynamoDBRequestAtATime:
    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        if not environ.get("HTTP_X_AMZ_TARGET", "").startswith("DynamoDB"):
            return self.app(environ, start_response)
        with self.lock:
            # The whole response is produced under the lock.
            return list(self.app(environ, start_response))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, default=4566)
    args = parser.parse_args()
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        OneDynamoDBRequestAtATime(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
