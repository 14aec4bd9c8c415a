// Paths of the repository for the Node tests (run from anywhere: node --test tests/js/).
import path from 'node:path';
import { fileURLToPath } from 'node:url';

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', '..');
export const ENGINE = path.join(REPO, 'static', 'js', 'engine');
export const GOLDEN = path.join(REPO, 'tests', 'golden');
