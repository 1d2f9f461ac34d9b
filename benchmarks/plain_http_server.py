"""The least an HTTP server adds: Python's own `http.server`, one thread,
keep-alive, answering TF Serving's columnar predict request
(`{"inputs": {"text": [...]}}`) with `RawCTranslate2` called inline, and
no checks. `python -m benchmarks serve-engines` times it beside kt-serve:
what any server on the machine costs over CTranslate2 alone.

    python -m benchmarks.plain_http_server MODEL_DIR THREADS   # prints its port
"""

import http.server
import json
import sys


def main(argv=None):
    from benchmarks.serve_engines import RawCTranslate2

    model_dir, threads = argv or sys.argv[1:]
    raw = RawCTranslate2(model_dir, int(threads))

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive
        disable_nagle_algorithm = True  # headers and body go out at once

        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            text = json.loads(body)["inputs"]["text"]
            answer = json.dumps({"outputs": {"translation": raw.translate(text)}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
