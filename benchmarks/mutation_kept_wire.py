"""The kept survivors of issue 53's modules (benchmarks/mutation.py reads them through mutation_kept.KEPT):
the TRL environment's episode, the served env's sessions, its client and the run storage. Each with the
reason it is equivalent to the original or harmless."""

from __future__ import annotations

KEPT: dict[str, str] = {}

# issue 53: the TRL environment's episode (mgrpo_algo/experiments/trl_env.py)
_TRL = "mgrpo_algo.experiments.trl_env."
_TRL_ZIP = ("zip without strict=True in _finish: the branch runs only when len(raw) == len(seen) (the `or` "
            "before it), so strict has nothing to refuse")
_TRL_MAIN = ("the default of components.get('main_0'): the env's final observation always holds main_0's parts "
             "(HierarchyEnvironment._observe sets reward_components from the record, main_0 first)")
KEPT.update({
    _TRL + "x__canonical_call__mutmut_6": (
        "json.dumps(ensure_ascii=None): json reads a falsy ensure_ascii as False, as written (the test's non-ASCII "
        "subtask comes out unescaped either way)"),
    _TRL + "xǁFrozenSubEnvǁ_finish__mutmut_38": _TRL_ZIP,
    _TRL + "xǁFrozenSubEnvǁ_finish__mutmut_41": _TRL_ZIP,
    _TRL + "xǁFrozenSubEnvǁ_finish__mutmut_42": _TRL_ZIP,
    _TRL + "xǁFrozenSubEnvǁ_settle__mutmut_6": _TRL_MAIN,
    _TRL + "xǁFrozenSubEnvǁ_settle__mutmut_8": _TRL_MAIN,
})

# issue 53: the served env's sessions (mgrpo_env/openenv_server.py)
_SRV = "mgrpo_env.openenv_server.xǁ"
_SRV_MAIN = ("the default of env.rewards.get('main_0'): the AEC env's rewards hold main_0 from the reset on "
             "(PettingZoo pays every agent it has, 0 until the end), so the default is never read")
KEPT.update({
    _SRV + "HierarchyEnvironmentǁ_observe__mutmut_46": (
        "reward_components from the record before the end too: the record's components are empty until "
        "Episode._finish writes them, so mid-episode it is the same {}"),
    _SRV + "HierarchyEnvironmentǁ_observe__mutmut_52": _SRV_MAIN,
    _SRV + "HierarchyEnvironmentǁ_observe__mutmut_54": _SRV_MAIN,
    _SRV + "HierarchyEnvironmentǁ_observe__mutmut_57": _SRV_MAIN,
    _SRV + "_SessionEnvironmentǁstep__mutmut_10": (
        "_step_env(None, text): both envs' _step_env ignore the agent (the AEC env steps its own selection, the "
        "single env has one agent); step refused any other agent just before"),
})

# issue 53: the OpenEnv client (mgrpo_env/openenv_client.py), against the real server in process
_CL = "mgrpo_env.openenv_client.xǁMGRPOEnvClientǁ"
_CL_FLAG = ("the episodes counted in a session are only read as a flag (`if self._episodes_in_session:` in reset: "
            "close the last episode's session first); {} and disconnect() on a client without a connection does "
            "nothing, so the next reset connects afresh either way")
KEPT.update({
    _CL + "__init____mutmut_11": _CL_FLAG.format("a fresh client starting at 1 makes its first reset call disconnect(),"),
    _CL + "_send_and_receive__mutmut_5": _CL_FLAG.format("after a lost connection the socket is None already,"),
    _CL + "disconnect__mutmut_2": _CL_FLAG.format("after disconnect() the socket is None,"),
    _CL + "reset__mutmut_2": _CL_FLAG.format("reset sets the count just after disconnect() set it to 0 (the same line twice),"),
    _CL + "reset__mutmut_4": _CL_FLAG.format("= 1 instead of += 1 is as true,"),
    _CL + "reset__mutmut_5": _CL_FLAG.format("-= 1 gives -1, as true as 1,"),
    _CL + "reset__mutmut_6": _CL_FLAG.format("+= 2 is as true,"),
    _CL + "_send_and_receive__mutmut_7": (
        "suppress(None) instead of suppress(Exception) around closing the broken socket: websockets' close() does not "
        "raise on a connection that dropped or timed out (the tests' stopped server and silent peer), so nothing is "
        "suppressed either way; the guard is for a transport whose close fails"),
})

# issue 53: the run storage (mgrpo_algo/training/storage.py), on a local folder, memory:// and local:// (a file
# system with folders used without a rename)
_ST = "mgrpo_algo.training.storage.x"
_STR = _ST + "ǁRunStorageǁ"
_X = ("strips 'X' as well as '/': the same for every path whose part there does not begin or end with a capital X "
      "(the run's folders are workers/, checkpoints/, final/, trajectories/, buffers/ and iteration numbers)")
_IGNORE = ("rmtree without ignore_errors: the folder is this process's own and there to remove; the flag only "
           "matters when another process removes it at the same moment")
_MKDIRS = ("_makedirs on the file systems with folders here (local://, memory://) with exist_ok=True never raises "
           "FileExistsError for a folder that is there, and with exist_ok False/None the FileExistsError is "
           "suppressed: the folder is there either way (the suppress is for backends that raise despite exist_ok)")
_NAME = ("the name of a temporary folder inside this process's scratch folder (which close() removes whole): "
         "no reader looks for it by name")
_SCRATCH = ("the prefix of this process's scratch folder (mkdtemp under TMPDIR, removed whole by close()): nothing "
            "looks for it by name")
_MARKER = ("the commit marker's bytes: its presence is the commit (is_folder looks it up with exists), its content "
           "is never read")
_LS = ("the fsspec listings here (memory://, local://) name folders without a trailing slash, so stripping it "
       "(or whitespace, or a leading slash before taking the last part) gives the same names")
KEPT.update({
    _ST + "_drop_json_after__mutmut_2": (
        "glob on a folder that is not there: Path.glob yields nothing for a missing folder, as the guard does"),
    _STR + "__init____mutmut_1": "the default of _rel: only child() passes _parent, and always with _rel",
    _STR + "__init____mutmut_7": (
        "a child's root when its parent's root is empty: no storage has an empty root (a local path is absolute, an "
        "fsspec URL names its bucket or folder; memory:// alone maps '/a' and 'a' to the same key)"),
    _STR + "__init____mutmut_11": _X,
    _STR + "__init____mutmut_28": (
        "root.rstrip(None) (whitespace) instead of rstrip('/'): fsspec's own URL parsing of memory:// and local:// "
        "already drops a trailing slash (a test writes through memory://<name>/ and reads through memory://<name>)"),
    _STR + "__init____mutmut_30": _X,
    _STR + "__init____mutmut_44": "guarded = None instead of False: read only for truth (_guard), None is as false",
    _STR + "_makedirs__mutmut_1": _MKDIRS,
    _STR + "_makedirs__mutmut_3": _MKDIRS,
    _STR + "_makedirs__mutmut_5": _MKDIRS,
    _STR + "_makedirs__mutmut_6": _MKDIRS,
    _STR + "_where__mutmut_5": _X,
    _STR + "create_folder__mutmut_3": (
        "_io('create', None) instead of ('create', ''): the failure names path(rel), and path() reads a None rel as "
        "'' (it tests rel for truth): the same folder is named"),
    _STR + "child__mutmut_1": "the spec of a child: __init__ ignores it when _parent is given",
    _STR + "child__mutmut_7": "the spec of a child: __init__ ignores it when _parent is given",
    _STR + "child__mutmut_9": _X,
    _STR + "names__mutmut_10": (
        "os.listdir without the is_dir() check: a missing folder raises FileNotFoundError, a file NotADirectoryError, "
        "and names() turns both into [] as the check does"),
    _STR + "names__mutmut_15": _LS,
    _STR + "names__mutmut_16": _LS,
    _STR + "names__mutmut_17": _LS,
    _STR + "names__mutmut_19": "ls(detail=None) instead of False: fsspec tests detail for truth, names come back either way",
    _STR + "local_folder__mutmut_6": _NAME,
    _STR + "local_folder__mutmut_7": _NAME,
    _STR + "local_folder__mutmut_26": _X,
    _STR + "remove__mutmut_13": _IGNORE,
    _STR + "remove__mutmut_15": _IGNORE,
    _STR + "remove__mutmut_16": _IGNORE,
    _STR + "remove__mutmut_22": (
        "isdir(root) instead of isdir(rel) picks rm(recursive=True) for a file too: fsspec removes a file the same "
        "with or without recursive"),
    _STR + "save_folder__mutmut_12": _NAME,
    _STR + "save_folder__mutmut_14": _NAME,
    _STR + "save_folder__mutmut_16": _NAME,
    _STR + "save_folder__mutmut_17": _NAME,
    _STR + "save_folder__mutmut_71": _MARKER,
    _STR + "save_folder__mutmut_73": _IGNORE,
    _STR + "save_folder__mutmut_75": _IGNORE,
    _STR + "save_folder__mutmut_76": _IGNORE,
    _STR + "scratch__mutmut_4": _SCRATCH,
    _STR + "scratch__mutmut_5": _SCRATCH,
    _STR + "scratch__mutmut_6": _SCRATCH,
})
