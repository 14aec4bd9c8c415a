// The server's page facts (python -m andrea.page_facts) where static/js/app/facts.js looks for
// them under Node: import this before any page module. The interpreter is the checkout's venv
// (scripts/test puts it first on PATH; ANDREA_VENV as scripts/venv.sh names it).
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { REPO } from './paths.mjs';

const venv = process.env.ANDREA_VENV ?? path.join(REPO, '.venv');
const python = existsSync(path.join(venv, 'bin', 'python')) ? path.join(venv, 'bin', 'python') : 'python3';
globalThis.andreaFacts = JSON.parse(execFileSync(python, ['-P', '-m', 'andrea.page_facts'], { encoding: 'utf8' }));
export const FACTS = globalThis.andreaFacts;
