# airlock's downloader, run inside an image build's download sandbox by the
# host's interpreter with -I -S (the standard library only). It fetches the
# files the host asked for, through the egress proxy (the only way out), into
# the one writable folder. It checks nothing: the host hashes every file
# before anything reads it.
import concurrent.futures
import html.parser
import json
import os
import ssl
import sys
import urllib.parse
import urllib.request

plan = json.load(open(sys.argv[1]))
out = plan["out"]
index = plan["index"].rstrip("/") + "/"
context = ssl.create_default_context(cafile=plan.get("cafile"))
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler(), urllib.request.HTTPSHandler(context=context)
)
opener.addheaders = [("User-Agent", "airlock-image-build")]


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def on_index(project, file_name):
    """The URL the index's simple page gives for file_name."""
    page = index + project + "/"
    request = urllib.request.Request(
        page,
        headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"},
    )
    with opener.open(request, timeout=60) as response:
        body = response.read(64 << 20)
        kind = response.headers.get("Content-Type", "")
        base = response.geturl()
    if "json" in kind:
        hrefs = [f.get("url", "") for f in json.loads(body).get("files", [])]
    else:
        parser = Links()
        parser.feed(body.decode("utf-8", "replace"))
        hrefs = parser.hrefs
    for href in hrefs:
        url = urllib.parse.urljoin(base, href)
        path = urllib.parse.urlsplit(url).path
        if urllib.parse.unquote(path.rsplit("/", 1)[-1]) == file_name:
            return url
    raise LookupError(f"{page} does not list {file_name}")


def fetch(item):
    url = item["url"] or on_index(item["project"], item["file_name"])
    part = os.path.join(out, item["sha256"] + ".part")
    size = 0
    for attempt in (1, 2):
        try:
            with opener.open(url, timeout=60) as response, open(part, "wb") as f:
                while chunk := response.read(1 << 20):
                    f.write(chunk)
                    size += len(chunk)
            break
        except OSError:
            size = 0
            if attempt == 2:
                raise
    os.rename(part, os.path.join(out, item["sha256"]))
    return f"fetched {item['file_name']} ({size} bytes) from {url}"


failures = 0
with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
    jobs = {pool.submit(fetch, item): item for item in plan["files"]}
    for job in concurrent.futures.as_completed(jobs):
        item = jobs[job]
        try:
            print(job.result(), flush=True)
        except Exception as error:  # every failure is reported, then the step fails
            failures += 1
            print(f"could not fetch {item['file_name']}: {error}", file=sys.stderr, flush=True)
sys.exit(1 if failures else 0)
