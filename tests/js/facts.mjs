// The server's page facts (server/page_facts.py) where static/js/app/facts.js looks for them
// under Node: import this before any page module.
import { serverJson } from './server.mjs';

globalThis.andreaFacts = serverJson('import json; from andrea.page_facts import page_facts; '
  + 'print(json.dumps(page_facts()))');
export const FACTS = globalThis.andreaFacts;
