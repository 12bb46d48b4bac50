"""List a model repo's files, each with the hash its source publishes, on Hugging Face or ModelScope.

Key design choice: each source is asked for its file list with hashes once, and every download URL is
built from that answer. Hugging Face goes through huggingface_hub (the Hub's own client: token from
HF_TOKEN or `hf auth login`): `model_info(files_metadata=True)` gives each file's git blob sha1 and, for
LFS files, the content's sha256; URLs are pinned to the commit the listing describes. ModelScope has
no client here (the `modelscope` package is large): its REST API is read as its client reads it,
`GET /api/v1/models/{repo}/repo/files?Revision=&Recursive=True` (each file's `Sha256`) and
`GET /api/v1/models/{repo}/repo?Revision=&FilePath=` (the bytes), token from MODELSCOPE_API_TOKEN.
Credentials are never sent on a redirect (the bytes usually come from a CDN).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from urllib.parse import quote, urlencode

SOURCES = ("huggingface", "modelscope")
DEFAULT_ENDPOINTS = {"huggingface": "https://huggingface.co", "modelscope": "https://www.modelscope.cn"}
# The variables each source's own client reads; MODELSCOPE_DOMAIN is usually a bare domain.
ENDPOINT_VARIABLES = {"huggingface": "HF_ENDPOINT", "modelscope": "MODELSCOPE_DOMAIN"}
DEFAULT_REVISIONS = {"huggingface": "main", "modelscope": "master"}
USER_AGENT = "rapid_llm-download_model"
_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")


class DownloadError(RuntimeError):
    """A listing or download failed; the message names the file or request and the cause."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    url: str
    size: int
    hash_kind: str  # "sha256" (of the content) or "git-sha1" (git's blob id: sha1 of a header + content)
    digest: str | None

    def hasher(self) -> "hashlib._Hash":
        if self.hash_kind == "sha256":
            return hashlib.sha256()
        hasher = hashlib.sha1()
        hasher.update(b"blob %d\0" % self.size)
        return hasher


@dataclass(frozen=True)
class Listing:
    revision: str
    files: list[RemoteFile]
    credentials: dict[str, str] = field(default_factory=dict)  # headers for the source's own host only


def open_url(url: str, credentials: dict[str, str], headers: dict[str, str] | None = None, timeout: float = 60):
    """GET `url`; credentials ride as unredirected headers, so a redirect to a CDN does not carry them."""
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT, **(headers or {})})
    for name, value in credentials.items():
        request.add_unredirected_header(name, value)
    try:
        return urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as error:
        detail = error.read(300).decode("utf-8", "replace").strip()
        raise DownloadError(f"GET {url}: HTTP {error.code} {error.reason}{': ' + detail if detail else ''}") from None
    except urllib.error.URLError as error:
        raise DownloadError(f"GET {url}: {error.reason}") from None


def _huggingface(repo_id: str, revision: str, endpoint: str) -> Listing:
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.errors import HfHubHTTPError
    from huggingface_hub.utils import build_hf_headers

    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, revision=revision, files_metadata=True)
    except HfHubHTTPError as error:
        raise DownloadError(f"Hugging Face cannot list {repo_id}@{revision}: {error}") from None
    files = []
    for sibling in info.siblings or []:
        if sibling.lfs is not None:
            kind, digest, size = "sha256", sibling.lfs.sha256, sibling.lfs.size
        else:
            kind, digest, size = "git-sha1", sibling.blob_id, sibling.size
        url = hf_hub_url(repo_id, sibling.rfilename, revision=info.sha, endpoint=endpoint)
        files.append(RemoteFile(sibling.rfilename, url, size or 0, kind, digest))
    token = build_hf_headers().get("authorization")
    return Listing(info.sha or revision, files, {"Authorization": token} if token else {})


def _modelscope(repo_id: str, revision: str, endpoint: str) -> Listing:
    token = os.environ.get("MODELSCOPE_API_TOKEN")
    # The long-standing client authenticates with the cookie, the newer one with a bearer header.
    credentials = {"Authorization": f"Bearer {token}", "Cookie": f"m_session_id={token}"} if token else {}
    base = f"{endpoint}/api/v1/models/{quote(repo_id)}/repo"
    with open_url(f"{base}/files?{urlencode({'Revision': revision, 'Recursive': 'True'})}", credentials) as response:
        body = json.load(response)
    if body.get("Code") != 200 or not body.get("Success"):
        raise DownloadError(f"ModelScope cannot list {repo_id}@{revision}: {body.get('Message') or body}")
    files = [RemoteFile(entry["Path"], f"{base}?{urlencode({'Revision': revision, 'FilePath': entry['Path']})}",
                        entry["Size"], "sha256", (entry.get("Sha256") or "").lower() or None)
             for entry in (body.get("Data") or {}).get("Files") or [] if entry.get("Type") != "tree"]
    return Listing(revision, files, credentials)


def list_files(source: str, repo_id: str, revision: str | None, endpoint: str | None) -> Listing:
    """Every file of `repo_id` at `revision` (the source's default branch when None), with its hash."""
    if source not in SOURCES:
        raise DownloadError(f"unknown source {source!r}: use one of {', '.join(SOURCES)}")
    if not _REPO_ID.fullmatch(repo_id) or ".." in repo_id:
        raise DownloadError(f"{repo_id!r} is not a repo id like owner/name")
    endpoint = (endpoint or os.environ.get(ENDPOINT_VARIABLES[source]) or DEFAULT_ENDPOINTS[source]).strip()
    endpoint = (endpoint if "://" in endpoint else f"https://{endpoint}").rstrip("/")
    lister = _huggingface if source == "huggingface" else _modelscope
    return lister(repo_id, revision or DEFAULT_REVISIONS[source], endpoint)
