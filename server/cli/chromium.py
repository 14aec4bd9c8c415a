"""The browser half of `andrea train`: finding Chromium, launching it through Playwright, checking
that it offers a WebGPU adapter, and driving the run page until the run is done.

`andrea train` uses the system's Chromium (/usr/bin/chromium, Debian's `apt-get install
chromium`) or the Chromium/Chrome executable that ANDREA_CHROMIUM names; Playwright only drives it,
so Playwright's own browser download (`playwright install`) is never needed. Everything that can
go wrong here before a run exists (Playwright cannot be imported, no browser at the path, a
browser that does not start, no WebGPU adapter) is a BrowserError with a one-line reason, raised
before the caller creates a run. The server is never called from here: the page talks to it, and
the caller's `tick` polls it.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import urllib.parse
from typing import Callable

from andrea.cli.browser_flags import SWIFTSHADER, webgpu_args
from andrea.cli.stop_signals import INTERRUPTED, PageInterrupt
from andrea.web.auth import token_init_script

DEFAULT_CHROMIUM = "/usr/bin/chromium"


def chromium_path() -> str:
    """The browser `andrea train` uses: ANDREA_CHROMIUM, else Debian's Chromium."""
    return os.environ.get("ANDREA_CHROMIUM") or DEFAULT_CHROMIUM


CHROMIUM = chromium_path()   # the tests' browser fixture launches the same one (tests/browser.py)
NO_DOWNLOAD = "Playwright's own browser download is not needed"
STOP_GRACE_S = 30       # after Ctrl-C: time for the page to stop, upload and commit
PROBE_TIMEOUT_S = 30    # requestAdapter() that does not settle within this is reported
# The adapter is asked for on a page of this (https, so secure-context) origin, served by
# Playwright itself: the check needs no server and runs before one is started.
PROBE_ORIGIN = "https://andrea-webgpu-check.invalid"


class BrowserError(Exception):
    """Why the browser cannot train here, in one line."""


def _where(path: str) -> str:
    return f"ANDREA_CHROMIUM={path}" if os.environ.get("ANDREA_CHROMIUM") else path


def find_chromium() -> str:
    """The browser's executable, checked before anything is started or created."""
    given = os.environ.get("ANDREA_CHROMIUM")
    path = given or DEFAULT_CHROMIUM
    found = shutil.which(path)
    if found:
        return found
    if given and os.path.exists(given):
        raise BrowserError(f"ANDREA_CHROMIUM={given} is not an executable file: point it at a "
                           f"Chromium or Chrome executable, or unset it to use {DEFAULT_CHROMIUM}")
    if given:
        raise BrowserError(f"no browser at ANDREA_CHROMIUM={given}: point ANDREA_CHROMIUM at a "
                           f"Chromium or Chrome executable, or unset it to use {DEFAULT_CHROMIUM} "
                           f"(apt-get install chromium); {NO_DOWNLOAD}")
    raise BrowserError(f"no browser at {DEFAULT_CHROMIUM}: install Chromium (apt-get install "
                       f"chromium) or set ANDREA_CHROMIUM to a Chromium or Chrome executable; "
                       f"{NO_DOWNLOAD}")


def _playwright():
    """Playwright's sync API; a missing or broken install (its greenlet or driver) is one line."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except Exception as e:   # ImportError, or a native module that does not load
        raise BrowserError(f"Playwright cannot be imported ({type(e).__name__}: "
                           f"{_first_line(e)}): reinstall andrea, or pip install playwright; "
                           f"{NO_DOWNLOAD}") from None
    return Error, sync_playwright


def _first_line(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0] if lines else type(e).__name__


def _launch_failure(e: BaseException, path: str) -> str:
    """Playwright's launch error is a page of flags and call log: the exit code and the
    browser's last line on stderr are what say why."""
    text = str(e)
    exited = re.search(r"<process did exit: exitCode=(\w+), signal=(\w+)>", text)
    said = [ln.strip() for ln in re.findall(r"\[pid=\d+\]\[err\] (.*)", text) if ln.strip()]
    if exited and exited.group(1) != "null":
        why = f"it exited at once with code {exited.group(1)}"
    elif exited and exited.group(2) != "null":
        why = f"it was killed by {exited.group(2)}"
    else:
        why = _first_line(e).removeprefix("BrowserType.launch: ")
    if said:
        why += f" ({said[-1][:300]})"
    fix = ("ANDREA_CHROMIUM must name a Chromium or Chrome that runs here (or unset it for "
           f"{DEFAULT_CHROMIUM}: apt-get install chromium)" if os.environ.get("ANDREA_CHROMIUM")
           else "reinstall it (apt-get install chromium) or set ANDREA_CHROMIUM to another "
                "Chromium or Chrome")
    return f"the browser at {_where(path)} did not start: {why}; {fix}"


_PROBE = """async (timeoutMs) => {
  if (!navigator.gpu) return { error: 'no-webgpu' };
  const adapter = await Promise.race([
    navigator.gpu.requestAdapter({ powerPreference: 'high-performance' }),
    new Promise((resolve) => setTimeout(() => resolve('timeout'), timeoutMs))]);
  if (adapter === 'timeout') return { error: 'timeout' };
  if (!adapter) return { error: 'no-adapter' };
  const info = adapter.info || {};
  return { vendor: info.vendor || '', architecture: info.architecture || '',
           description: info.description || '',
           fallback: Boolean(info.isFallbackAdapter ?? adapter.isFallbackAdapter) };
}"""


def drive_result(**given) -> dict:
    """What Chromium.drive returns, as far as it got: `given` on top of nothing yet."""
    return {"done": None, "errors": [], "error_text": None, "stats": None, "interrupted": False,
            "timed_out": False, "refused": None, "lost": None, **given}


def software_adapter(found: dict) -> bool:
    """SwiftShader, llvmpipe and their kind: what a browser offers when it finds no GPU (the
    page asks the same of its adapter: isSoftware in static/js/engine/gpu.js)."""
    text = " ".join(str(found.get(k, "")) for k in ("vendor", "architecture", "description"))
    return bool(found.get("fallback")) or bool(
        re.search(r"swiftshader|llvmpipe|lavapipe|software", text, re.IGNORECASE))


def adapter_words(found: dict) -> str:
    return " ".join(filter(None, (found.get("vendor"), found.get("architecture")))) or "an adapter"


class Chromium:
    """Playwright and one Chromium for the command's lifetime:
    check() (no process started), launch(), probe() (a WebGPU adapter), drive() (the run page),
    close()."""

    def __init__(self, gpu: bool = False):
        self.gpu = gpu
        self.path: str | None = None
        self.version: str | None = None
        self._playwright = None
        self._browser = None
        self._error = Exception

    def check(self) -> None:
        """Playwright imports and the executable is there: cheap, before any server or run."""
        self._error, self._sync_playwright = _playwright()
        self.path = find_chromium()

    def launch(self) -> None:
        if self.path is None:
            self.check()
        try:
            self._playwright = self._sync_playwright().start()
        except Exception as e:
            raise BrowserError(f"Playwright's driver did not start: {_first_line(e)}; reinstall "
                               f"andrea, or pip install playwright") from None
        try:
            # Ctrl-C is ours to handle: the browser must live on to stop the run cleanly.
            self._browser = self._playwright.chromium.launch(
                executable_path=self.path, handle_sigint=False, handle_sigterm=False,
                handle_sighup=False,
                args=webgpu_args(self.gpu))
        except Exception as e:
            raise BrowserError(_launch_failure(e, self.path)) from None
        self.version = self._browser.version

    def probe(self) -> dict:
        """The WebGPU adapter the run page will get (the same flags, the same request), asked for
        on a blank secure page; BrowserError when there is none."""
        context = self._browser.new_context()
        try:
            context.route(PROBE_ORIGIN + "/**", lambda route: route.fulfill(
                status=200, content_type="text/html", body="<!doctype html><title>check</title>"))
            page = context.new_page()
            page.goto(PROBE_ORIGIN + "/")
            found = page.evaluate(_PROBE, PROBE_TIMEOUT_S * 1000)
        except self._error as e:
            raise BrowserError(f"the browser at {_where(self.path)} failed while checking for "
                               f"WebGPU: {_first_line(e)}") from None
        finally:
            try:
                context.close()
            except self._error:
                pass
        error = found.get("error")
        where = _where(self.path)
        if error == "no-webgpu":
            raise BrowserError(f"the browser at {where} ({self.version}) has no WebGPU "
                               f"(navigator.gpu is missing): Chromium or Chrome 113 or newer is "
                               f"needed")
        if error == "timeout":
            raise BrowserError(f"the browser at {where} did not answer for a WebGPU adapter "
                               f"within {PROBE_TIMEOUT_S} s")
        if error == "no-adapter" and self.gpu:
            raise BrowserError(f"no WebGPU adapter: the browser at {where} offered none through "
                               f"Vulkan (--gpu); the GPU or its driver may be missing or "
                               f"blocklisted; without --gpu it trains on SwiftShader, Chromium's "
                               f"software adapter (slow but correct)")
        if self.gpu and software_adapter(found):
            raise BrowserError(f"no GPU adapter: the browser at {where} offered only "
                               f"{adapter_words(found)}, a software one, through Vulkan (--gpu); "
                               f"the GPU or its driver may be missing or blocklisted; without "
                               f"--gpu it trains on SwiftShader on purpose")
        if error == "no-adapter":
            raise BrowserError(f"no WebGPU adapter: the browser at {where} offered none, not even "
                               f"SwiftShader, its software one (started with "
                               f"{' '.join(SWIFTSHADER)}); a Chromium built without it cannot "
                               f"train here; --gpu tries the machine's GPU through Vulkan")
        return found

    def drive(self, url: str, run: dict, timeout: float,
              tick: Callable[[], str | None], join_token: str | None = None) -> dict:
        """Opens the run page with the write token in sessionStorage (never in the URL), so the
        page trains the run; watches it until done, failing fast on page and asset errors and on
        what `tick` (called twice a second; it polls the server) returns as an error.
        Returns {done, errors, error_text, stats, interrupted, refused}; done is None when the
        page never said (then errors say why), and after Ctrl-C when the page could not stop the
        run; refused is the server's reason when it refused the page's trainer socket for good
        (a revoked token, another trainer: the page then ends `failed` at once, error_text
        saying why). With `join_token`, the page of a room run is opened from its join link
        and joins the room as a worker at once (static/js/app/room.js)."""
        run_id = run["id"]
        origin = urllib.parse.urlparse(url)
        errors: list[str] = []

        def on_response(response):
            # A missing module, stylesheet or shader leaves the page half-built and silent.
            u = urllib.parse.urlparse(response.url)
            if response.status >= 400 and u.netloc == origin.netloc and \
                    u.path.startswith(("/static/", "/shaders/", "/runs/")):
                errors.append(f"GET {u.path}: HTTP {response.status}")

        def on_failed(request):
            u = urllib.parse.urlparse(request.url)
            if u.netloc == origin.netloc and u.path.startswith(("/static/", "/shaders/")):
                errors.append(f"GET {u.path} failed: {request.failure}")

        state = drive_result(errors=errors)
        try:
            context = self._browser.new_context()
        except self._error as e:
            errors.append(f"browser: {_first_line(e)}")
            return state
        page = None
        interrupt = PageInterrupt()
        try:
            with interrupt:
                page = context.new_page()
                page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
                page.on("response", on_response)
                page.on("requestfailed", on_failed)
                if join_token is None:
                    page.add_init_script(token_init_script(run_id, run["token"]))
                else:
                    page.add_init_script("window.andreaAutoJoin = true;")
                if self.gpu:   # the page refuses a software adapter rather than train on it
                    page.add_init_script("window.andreaGpuOnly = true;")
                join = "" if join_token is None else \
                    "#join=" + urllib.parse.quote(join_token, safe="")
                page.goto(f"{url}/runs/{run_id}{join}")
                state["done"] = self._watch(page, errors, timeout, tick, interrupt)
                if interrupt.seen:
                    raise KeyboardInterrupt
                if state["done"] is None and not errors:    # --timeout: stopped, not left
                    state["timed_out"] = True               # running with nobody training it
                    print(f"\nno result within {timeout:.0f} s: stopping the run",
                          file=sys.stderr, flush=True)
                    state["done"] = self._stop_page(
                        page, f"stopped by the command's --timeout of {timeout:.0f} s")
        except KeyboardInterrupt:
            state["interrupted"] = True
            print("\ninterrupted: stopping the run", file=sys.stderr, flush=True)
            state["done"] = self._stop_page(page, INTERRUPTED) if page is not None else None
        except self._error as e:
            errors.append(f"browser: {_first_line(e)}")
        try:
            if page is not None:
                state["error_text"] = page.evaluate(
                    "document.getElementById('error')?.hidden === false"
                    " ? document.getElementById('error').textContent : null")
                state["stats"] = page.evaluate(
                    "window.andreaTrainer ? window.andreaTrainer.stats : null")
                state["refused"] = page.evaluate("document.body?.dataset.refused ?? null")
                state["lost"] = page.evaluate("document.body?.dataset.deviceLost ?? null")
        except self._error:
            pass
        try:
            context.close()   # the page's trainer socket closes with it
        except self._error:
            pass
        return state

    def _watch(self, page, errors: list[str], timeout: float, tick, interrupt) -> str | None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not interrupt.seen:
            done = page.evaluate("document.body?.dataset.done || null")
            if done or errors:
                return done
            problem = tick()
            if problem:
                errors.append(problem)
                return None
            page.wait_for_timeout(500)
        return None

    def _stop_page(self, page, why: str) -> str | None:
        """Ctrl-C or --timeout: the page stops the trainer (`why` its message), uploads the
        weights and commits every record. None if it cannot (the browser went down with the
        signal): the caller tells the server."""
        try:
            if page.evaluate("Boolean(window.andreaTrainer)"):
                page.evaluate("(why) => window.andreaTrainer.stop(why)", why)
                page.wait_for_function("document.body.dataset.done",
                                       timeout=STOP_GRACE_S * 1000)
                return page.evaluate("document.body.dataset.done")
        except (self._error, KeyboardInterrupt):
            pass
        return None

    def crash_gpu_process(self) -> None:
        """Crashes the browser's GPU process (DevTools' Browser.crashGpuProcess, as a
        chrome://gpucrash tab would): every page's WebGPU device is lost. For tests and the GPU
        bench: what a driver reset does to a run."""
        self._browser.new_browser_cdp_session().send("Browser.crashGpuProcess")

    def close(self) -> None:
        for close in (getattr(self._browser, "close", None),
                      getattr(self._playwright, "stop", None)):
            if close is None:
                continue
            try:
                close()
            except Exception:   # a browser that already went away: nothing left to close
                pass
        self._browser = self._playwright = None
