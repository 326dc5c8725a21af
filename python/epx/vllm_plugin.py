"""epx inside vLLM without a patch: vLLM's `vllm.general_plugins` entry point.

vLLM runs every installed general plugin in each of its processes
(vllm.plugins.load_general_plugins). This one, `epx = epx.vllm_plugin:register`
in python/pyproject.toml, is installed with the epx package and does nothing
unless EPX_VLLM_ALGORITHM is set:

  EPX_VLLM_ALGORITHM=deepseek  DeepSeek's EPLB computed by libepx, in this vLLM
                               release's arithmetic and call shape
                               (epx.vllm.policy_for(version)): the placements
                               vLLM's own policy gives, faster;
  EPX_VLLM_ALGORITHM=epx       epx's own planner in the same call shape
                               (epx.vllm.EpxEplbPolicy and its siblings).

Either way it puts the class into vLLM's policy table,
vllm.distributed.eplb.policy.EPLB_POLICIES["default"], the entry EplbState
reads for the default `--eplb-config '{"policy": "default"}'`, and logs one
line on vLLM's logger saying so. The table is a dict that eplb_state imports
by reference, so it does not matter which is imported first. vLLM releases
with the table: 0.13.0 and later; older ones are refused with the reason.

Any other value stops vLLM at start-up with an error naming the value and
the choices (vLLM runs general plugins outside its own try), rather than
serving with a policy the user did not ask for.
"""
import logging
import os

ENV = "EPX_VLLM_ALGORITHM"
CHOICES = ("deepseek", "epx")
_WHAT = {"deepseek": "DeepSeek's EPLB as this vLLM release computes it, by libepx",
         "epx": "epx's own planner"}

# A child of vLLM's "vllm" logger, so the line comes out in vLLM's format
# wherever vLLM configured its logging.
_log = logging.getLogger("vllm.plugins.epx")


def _choice():
    """The algorithm EPX_VLLM_ALGORITHM asks for, None when unset or empty."""
    raw = os.environ.get(ENV)
    if raw is None or raw.strip() == "":
        return None
    if raw.strip() not in CHOICES:
        raise ValueError(
            "%s=%r is not an epx EPLB algorithm: set %s=deepseek (DeepSeek's EPLB, as vLLM "
            "computes it, by libepx) or %s=epx (epx's planner), or unset it to keep vLLM's "
            "own policy (choices: %s)" % (ENV, raw, ENV, ENV, ", ".join(CHOICES)))
    return raw.strip()


def _vllm_version():
    """The running vLLM's release: vllm.__version__, else its installed metadata."""
    import vllm

    v = getattr(vllm, "__version__", None)
    if v:
        return str(v)
    try:
        from importlib.metadata import version

        return version("vllm")
    except Exception:  # no metadata either: vLLM itself could not say
        return None


def register():
    """The entry point vLLM calls. Returns the class now in
    EPLB_POLICIES["default"] (None when EPX_VLLM_ALGORITHM is unset)."""
    algorithm = _choice()
    if algorithm is None:
        return None
    from . import vllm as drop_in

    version = _vllm_version()
    if version is None:
        version = drop_in.VERIFIED_VERSIONS[-1]
        _log.warning("epx: vLLM's release is unknown (no vllm.__version__, no metadata); "
                     "assuming %s's EPLB policy API", version)
    try:
        cls = drop_in.policy_for(version, algorithm)
    except ValueError as e:
        raise RuntimeError("%s=%s: %s; epx's plugin needs vLLM's EPLB policy table "
                           "(vllm.distributed.eplb.policy.EPLB_POLICIES, vLLM 0.13.0 or later): "
                           "upgrade vLLM or unset %s" % (ENV, algorithm, e, ENV)) from None
    try:
        from vllm.distributed.eplb import policy
    except ImportError as e:
        raise RuntimeError("%s=%s: vLLM %s has no EPLB policy table "
                           "(vllm.distributed.eplb.policy: %s); epx's plugin needs vLLM 0.13.0 "
                           "or later: upgrade vLLM or unset %s"
                           % (ENV, algorithm, version, e, ENV)) from None
    table = policy.EPLB_POLICIES
    if table.get("default") is not cls:
        before = table.get("default")
        table["default"] = cls
        _log.info("epx: vLLM's EPLB policy 'default' is epx's now (%s=%s: %s; epx.vllm.%s "
                  "for vLLM %s, in place of %s)", ENV, algorithm, _WHAT[algorithm],
                  cls.__name__, version, getattr(before, "__qualname__", before))
    return cls
