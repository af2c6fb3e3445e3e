// The pdserve subcommands. Each takes the arguments after its name and returns the exit code:
// 0 success, 1 runtime error, 2 usage error.
#ifndef PDSERVE_CLI_COMMANDS_H_
#define PDSERVE_CLI_COMMANDS_H_

namespace pdserve::cli {

int MakeModelCommand(int argc, char** argv);
int TrainTokenizerCommand(int argc, char** argv);
int GenerateCommand(int argc, char** argv);
int KvCalcCommand(int argc, char** argv);
int GgufCommand(int argc, char** argv);
int BenchEngineCommand(int argc, char** argv);
int ProfileCommand(int argc, char** argv);
int SimulateCommand(int argc, char** argv);
int PlanCommand(int argc, char** argv);
int BenchCommand(int argc, char** argv);
int BenchTransportCommand(int argc, char** argv);
int TokenizeCommand(int argc, char** argv);
int ChatTemplateCommand(int argc, char** argv);
int DetokenizeCommand(int argc, char** argv);
int PrefillCommand(int argc, char** argv);
int DecodeCommand(int argc, char** argv);
int RouterCommand(int argc, char** argv);
int ServeCommand(int argc, char** argv);

// Routes SIGTERM/SIGINT to the tier commands' shutdown path. main() calls it first.
void InstallStopSignalHandler();
// For the commands that do not serve (generate, bench, simulate, plan, ...): SIGTERM or SIGINT
// ends the process at once, with 128 + the signal's number (130 for Ctrl-C) and a line on stderr.
void StartExitOnStopSignal(const char* cmd);

}  // namespace pdserve::cli

#endif  // PDSERVE_CLI_COMMANDS_H_
