// What the server says, for the Node tests of the page modules: its own Python code, run in the
// checkout's venv (scripts/test puts it first on PATH; ANDREA_VENV as scripts/venv.sh names it).
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { REPO } from './paths.mjs';

const venv = process.env.ANDREA_VENV ?? path.join(REPO, '.venv');
const PYTHON = existsSync(path.join(venv, 'bin', 'python')) ? path.join(venv, 'bin', 'python') : 'python3';

/** The JSON that Python `code` prints (sys.argv[1:] = args). */
export const serverJson = (code, ...args) => JSON.parse(
  execFileSync(PYTHON, ['-P', '-c', code, ...args], { encoding: 'utf8' }));

/** The run layout the server makes for `config`, a RunConfig (server/run_config.py run_layout). */
export const serverLayout = (config) => serverJson(
  'import json, sys; from andrea.run_config import RunConfig, run_layout; '
  + 'print(json.dumps(run_layout(RunConfig.model_validate_json(sys.argv[1]))))',
  JSON.stringify(config));
