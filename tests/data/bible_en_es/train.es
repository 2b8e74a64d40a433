EN el principio crió Dios los cielos y la tierra.
Y la tierra estaba desordenada y vacía, y las tinieblas estaban sobre la haz del abismo, y el Espíritu de Dios se movía sobre la haz de las aguas.
Y dijo Dios: Sea la luz: y fué la luz.
Y vió Dios que la luz era buena: y apartó Dios la luz de las tinieblas.
Y llamó Dios á la luz Día, y á las tinieblas llamó Noche: y fué la tarde y la mañana un día.
Y dijo Dios: Haya expansión en medio de las aguas, y separe las aguas de las aguas.
E hizo Dios la expansión, y apartó las aguas que estaban debajo de la expansión, de las aguas que estaban sobre la expansión: y fué así.
Y llamó Dios á la expansión Cielos: y fué la tarde y la mañana el día segundo.
Y dijo Dios: Júntense las aguas que están debajo de los cielos en un lugar, y descúbrase la seca: y fué así.
Y llamó Dios á la seca Tierra, y á la reunión de las aguas llamó Mares: y vió Dios que era bueno.
Y dijo Dios: Produzca la tierra hierba verde, hierba que dé simiente; árbol de fruto que dé fruto según su género, que su simiente esté en él, sobre la tierra: y fué así.
Y produjo la tierra hierba verde, hierba que da simiente según su naturaleza, y árbol que da fruto, cuya simiente está en él, según su género: y vió Dios que era bueno.
Y fué la tarde y la mañana el día tercero.
Y dijo Dios: Sean lumbreras en la expansión de los cielos para apartar el día y la noche: y sean por señales, y para las estaciones, y para días y años;
Y sean por lumbreras en la expansión de los cielos para alumbrar sobre la tierra: y fué así.
E hizo Dios las dos grandes lumbreras; la lumbrera mayor para que señorease en el día, y la lumbrera menor para que señorease en la noche: hizo también las estrellas.
Y púsolas Dios en la expansión de los cielos, para alumbrar sobre la tierra,
Y para señorear en el día y en la noche, y para apartar la luz y las tinieblas: y vió Dios que era bueno.
Y dijo Dios: Produzcan las aguas reptil de ánima viviente, y aves que vuelen sobre la tierra, en la abierta expansión de los cielos.
Y crió Dios las grandes ballenas, y toda cosa viva que anda arrastrando, que las aguas produjeron según su género, y toda ave alada según su especie: y vió Dios que era bueno.
Y Dios los bendijo diciendo: Fructificad y multiplicad, y henchid las aguas en los mares, y las aves se multipliquen en la tierra.
Y fué la tarde y la mañana el día quinto.
Y dijo Dios: Produzca la tierra seres vivientes según su género, bestias y serpientes y animales de la tierra según su especie: y fué así.
Y dijo Dios: Hagamos al hombre á nuestra imagen, conforme á nuestra semejanza; y señoree en los peces de la mar, y en las aves de los cielos, y en las bestias, y en toda la tierra, y en todo animal que anda arrastrando sobre la tierra.
Y crió Dios al hombre á su imagen, á imagen de Dios lo crió; varón y hembra los crió.
Y los bendijo Dios; y díjoles Dios: Fructificad y multiplicad, y henchid la tierra, y sojuzgadla, y señoread en los peces de la mar, y en las aves de los cielos, y en todas las bestias que se mueven sobre la tierra.
Y dijo Dios: He aquí que os he dado toda hierba que da simiente, que está sobre la haz de toda la tierra; y todo árbol en que hay fruto de árbol que da simiente, seros ha para comer.
Y á toda bestia de la tierra, y á todas las aves de los cielos, y á todo lo que se mueve sobre la tierra, en que hay vida, toda hierba verde les será para comer: y fué así.
Y vió Dios todo lo que había hecho, y he aquí que era bueno en gran manera. Y fué la tarde y la mañana el día sexto.
Y FUERON acabados los cielos y la tierra, y todo su ornamento.
Y acabó Dios en el día séptimo su obra que hizo, y reposó el día séptimo de toda su obra que había hecho.
Y bendijo Dios al día séptimo, y santificólo, porque en él reposó de toda su obra que había Dios criado y hecho.
Estos son los orígenes de los cielos y de la tierra cuando fueron criados, el día que Jehová Dios hizo la tierra y los cielos,
Y toda planta del campo antes que fuese en la tierra, y toda hierba del campo antes que naciese: porque aun no había Jehová Dios hecho llover sobre la tierra, ni había hombre para que labrase la tierra;
Mas subía de la tierra un vapor, que regaba toda la faz de la tierra.
Formó, pues, Jehová Dios al hombre del polvo de la tierra, y alentó en su nariz soplo de vida; y fué el hombre en alma viviente.
Y había Jehová Dios plantado un huerto en Edén al oriente, y puso allí al hombre que había formado.
Y había Jehová Dios hecho nacer de la tierra todo árbol delicioso á la vista, y bueno para comer: también el árbol de vida en medio del huerto, y el árbol de ciencia del bien y del mal.
Y salía de Edén un río para regar el huerto, y de allí se repartía en cuatro ramales.
El nombre del uno era Pisón: éste es el que cerca toda la tierra de Havilah, donde hay oro:
Y el oro de aquella tierra es bueno: hay allítambiénbdelio y piedra cornerina.
El nombre del segundo río es Gihón: éste es el que rodea toda la tierra de Etiopía.
Y el nombre del tercer río es Hiddekel: éste es el que va delante de Asiria. Y el cuarto río es el Eufrates.
Tomó, pues, Jehová Dios al hombre, y le puso en el huerto de Edén, para que lo labrara y lo guardase.
Y mandó Jehová Dios al hombre, diciendo: De todo árbol del huerto comerás;
Mas del árbol de ciencia del bien y del mal no comerás de él; porque el día que de él comieres, morirás.
Y dijo Jehová Dios: No es bueno que el hombre esté solo; haréle ayuda idónea para él.
Formó, pues, Jehová Dios de la tierra toda bestia del campo, y toda ave de los cielos, y trájolas á Adam, para que viese cómo les había de llamar; y todo lo que Adam llamó á los animales vivientes, ese es su nombre.
Y puso Adam nombres á toda bestia y ave de los cielos y á todo animal del campo: mas para Adam no halló ayuda que estuviese idónea para él.
Y Jehová Dios hizo caer sueño sobre Adam, y se quedó dormido: entonces tomó una de sus costillas, y cerró la carne en su lugar;
Y dijo Adam: Esto es ahora hueso de mis huesos, y carne de mi carne: ésta será llamada Varona, porque del varón fué tomada.
Y estaban ambos desnudos, Adam y su mujer, y no se avergonzaban.
EMPERO la serpiente era astuta, más que todos los animales del campo que Jehová Dios había hecho; la cual dijo á la mujer: ¿Conque Dios os ha dicho: No comáis de todo árbol del huerto?
Y la mujer respondió á la serpiente: Del fruto de los árboles del huerto comemos;
Mas del fruto del árbol que está en medio del huerto dijo Dios: No comeréis de él, ni le tocaréis, porque no muráis.
Mas sabe Dios que el día que comiereis de él, serán abiertos vuestros ojos, y seréis como dioses sabiendo el bien y el mal.
Y vió la mujer que el árbol era bueno para comer, y que era agradable á los ojos, y árbol codiciable para alcanzar la sabiduría; y tomó de su fruto, y comió; y dió también á su marido, el cual comió así como ella.
Y fueron abiertos los ojos de entrambos, y conocieron que estaban desnudos: entonces cosieron hojas de higuera, y se hicieron delantales.
Y oyeron la voz de Jehová Dios que se paseaba en el huerto al aire del día: y escondióse el hombre y su mujer de la presencia de Jehová Dios entre los árboles del huerto.
Y llamó Jehová Dios al hombre, y le dijo: ¿Dónde estás tú?
Y él respondió: Oí tu voz en el huerto, y tuve miedo, porque estaba desnudo; y escondíme.
Y díjole: ¿Quién te enseñó que estabas desnudo? ¿Has comido del árbol de que yo te mandé no comieses?
Y el hombre respondió: La mujer que me diste por compañera me dió del árbol, y yo comí.
Entonces Jehová Dios dijo á la mujer: ¿Qué es lo que has hecho? Y dijo la mujer: La serpiente me engañó, y comí.
Y Jehová Dios dijo á la serpiente: Por cuanto esto hiciste, maldita serás entre todas las bestias y entre todos los animales del campo; sobre tu pecho andarás, y polvo comerás todos los días de tu vida:
Y enemistad pondré entre ti y la mujer, y entre tu simiente y la simiente suya; ésta te herirá en la cabeza, y tú le herirás en el calcañar.
A la mujer dijo: Multiplicaré en gran manera tus dolores y tus preñeces; con dolor parirás los hijos; y á tu marido será tu deseo, y él se enseñoreará de ti.
Y al hombre dijo: Por cuanto obedeciste á la voz de tu mujer, y comiste del árbol de que te mandé diciendo, No comerás de él; maldita será la tierra por amor de ti; con dolor comerás de ella todos los días de tu vida;
Espinos y cardos te producirá, y comerás hierba del campo;
En el sudor de tu rostro comerás el pan hasta que vuelvas á la tierra; porque de ella fuiste tomado: pues polvo eres, y al polvo serás tornado.
Y llamó el hombre el nombre de su mujer, Eva; por cuanto ella era madre de todos los vivientes.
Y Jehová Dios hizo al hombre y á su mujer túnicas de pieles, y vistiólos.
Y dijo Jehová Dios: He aquí el hombre es como uno de Nos sabiendo el bien y el mal: ahora, pues, porque no alargue su mano, y tome también del árbol de la vida, y coma, y viva para siempre:
Y sacólo Jehová del huerto de Edén, para que labrase la tierra de que fué tomado.
Echó, pues, fuera al hombre, y puso al oriente del huerto de Edén querubines, y una espada encendida que se revolvía á todos lados, para guardar el camino del árbol de la vida.
Y CONOCIÓ Adam á su mujer Eva, la cual concibió y parió á Caín, y dijo: Adquirido he varón por Jehová.
Y después parió á su hermano Abel. Y fué Abel pastor de ovejas, y Caín fué labrador de la tierra.
Y aconteció andando el tiempo, que Caín trajo del fruto de la tierra una ofrenda á Jehová.
Y Abel trajo también de los primogénitos de sus ovejas, y de su grosura. Y miró Jehová con agrado á Abel y á su ofrenda;
Entonces Jehová dijo á Caín: ¿Por qué te has ensañado, y por qué se ha inmutado tu rostro?
Si bien hicieres, ¿no serás ensalzado? y si no hicieres bien, el pecado está á la puerta: con todo esto, á ti será su deseo, y tú te enseñorearás de él.
Y habló Caín á su hermano Abel: y aconteció que estando ellos en el campo, Caín se levantó contra su hermano Abel, y le mató.
Y Jehová dijo á Caín: ¿Dónde está Abel tu hermano? Y él respondió: No sé; ¿soy yo guarda de mi hermano?
Y él le dijo: ¿Qué has hecho? La voz de la sangre de tu hermano clama á mí desde la tierra.
Ahora pues, maldito seas tú de la tierra que abrió su boca para recibir la sangre de tu hermano de tu mano:
Cuando labrares la tierra, no te volverá á dar su fuerza: errante y extranjero serás en la tierra.
Y dijo Caín á Jehová: Grande es mi iniquidad para ser perdonada.
He aquí me echas hoy de la faz de la tierra, y de tu presencia me esconderé; y seré errante y extranjero en la tierra; y sucederá que cualquiera que me hallare, me matará.
Y respondióle Jehová: Cierto que cualquiera que matare á Caín, siete veces será castigado. Entonces Jehová puso señal en Caín, para que no lo hiriese cualquiera que le hallara.
Y salió Caín de delante de Jehová, y habitó en tierra de Nod, al oriente de Edén.
Y conoció Caín á su mujer, la cual concibió y parió á Henoch: y edificó una ciudad, y llamó el nombre de la ciudad del nombre de su hijo, Henoch.
Y á Henoch nació Irad, é Irad engendró á Mehujael, y Mehujael engendró á Methusael, y Methusael engendró á Lamech.
Y tomó para sí Lamech dos mujeres; el nombre de la una fué Ada, y el nombre de la otra Zilla.
Y Ada parió á Jabal, el cual fué padre de los que habitan en tiendas, y crían ganados.
Y el nombre de su hermano fué Jubal, el cual fué padre de todos los que manejan arpa y órgano.
Y Zilla también parió á Tubal-Caín, acicalador de toda obra de metal y de hierro: y la hermana de Tubal-Caín fué Naama.
Y dijo Lamech á sus mujeres: Ada y Zilla, oid mi voz; mujeres de Lamech, escuchad mi dicho: que varón mataré por mi herida, y mancebo por mi golpe:
Si siete veces será vengado Caín, Lamech en verdad setenta veces siete lo será.
Y conoció de nuevo Adam á su mujer, la cual parió un hijo, y llamó su nombre Seth: Porque Dios (dijo ella) me ha sustituído otra simiente en lugar de Abel, á quien mató Caín.
ESTE es el libro de las generaciones de Adam. El día en que crió Dios al hombre, á la semejanza de Dios lo hizo;
Varón y hembra los crió; y los bendijo, y llamó el nombre de ellos Adam, el día en que fueron criados.
Y vivió Adam ciento y treinta años, y engendróun hijoá su semejanza, conforme á su imagen, y llamó su nombre Seth.
Y fueron los días de Adam, después que engendró á Seth, ochocientos años: y engendró hijos é hijas.
Y fueron todos los días que vivió Adam novecientos y treinta años, y murió.
Y vivió Seth ciento y cinco años, y engendró á Enós.
Y vivió Seth, después que engendró á Enós, ochocientos y siete años: y engendró hijos é hijas.
Y fueron todos los días de Seth novecientos y doce años; y murió.
Y vivió Enós noventa años, y engendró á Cainán.
Y vivió Enós después que engendró á Cainán, ochocientos y quince años: y engendró hijos é hijas.
Y fueron todos los días de Enós novecientos y cinco años; y murió.
Y vivió Cainán setenta años, y engendró á Mahalaleel.
Y vivió Cainán, después que engendró á Mahalaleel, ochocientos y cuarenta años: y engendró hijos é hijas.
Y fueron todos los días de Cainán novecientos y diez años; y murió.
Y vivió Mahalaleel sesenta y cinco años, y engendró á Jared.
Y vivió Mahalaleel, después que engendró á Jared, ochocientos y treinta años: y engendró hijos é hijas.
Y fueron todos los días de Mahalaleel ochocientos noventa y cinco años; y murió.
Y vivió Jared, después que engendró á Henoch, ochocientos años: y engendró hijos é hijas.
Y fueron todos los días de Jared novecientos sesenta y dos años; y murió.
Y vivió Henoch sesenta y cinco años, y engendró á Mathusalam.
Y caminó Henoch con Dios, después que engendró á Mathusalam, trescientos años: y engendró hijos é hijas.
Y fueron todos los días de Henoch trescientos sesenta y cinco años.
Caminó, pues, Henoch con Dios, y desapareció, porque le llevó Dios.
Y vivió Mathusalam ciento ochenta y siete años, y engendró á Lamech.
Y vivió Mathusalam, después que engendró á Lamech, setecientos ochenta y dos años: y engendró hijos é hijas.
Fueron, pues, todos los días de Mathusalam, novecientos sesenta y nueve años; y murió.
Y vivió Lamech ciento ochenta y dos años, y engendró un hijo:
Y llamó su nombre Noé, diciendo: Este nos aliviará de nuestras obras, y del trabajo de nuestras manos, á causa de la tierra que Jehová maldijo.
Y vivió Lamech, después que engendró á Noé, quinientos noventa y cinco años: y engendró hijos é hijas.
Y fueron todos los días de Lamech setecientos setenta y siete años; y murió.
Y siendo Noé de quinientos años, engendró á Sem, Châm, y á Japhet.
Y ACAECIÓ que, cuando comenzaron los hombres á multiplicarse sobre la faz de la tierra, y les nacieron hijas,
Viendo los hijos de Dios que las hijas de los hombres eran hermosas, tomáronse mujeres, escogiendo entre todas.
Y dijo Jehová: No contenderá mi espíritu con el hombre para siempre, porque ciertamente él es carne: mas serán sus días ciento y veinte años.
Había gigantes en la tierra en aquellos días, y también después que entraron los hijos de Dios á las hijas de los hombres, y les engendraron hijos: éstos fueron los valientes que desde la antigüedad fueron varones de nombre.
Y vió Jehová que la malicia de los hombres era mucha en la tierra, y que todo designio de los pensamientos del corazón de ellos era de continuo solamente el mal.
Y arrepintióse Jehová de haber hecho hombre en la tierra, y pesóle en su corazón.
Y dijo Jehová: Raeré los hombres que he criado de sobre la faz de la tierra, desde el hombre hasta la bestia, y hasta el reptil y las aves del cielo: porque me arrepiento de haberlos hecho.
Empero Noé halló gracia en los ojos de Jehová.
Estas son las generaciones de Noé: Noé, varón justo, perfecto fué en sus generaciones; con Dios caminó Noé.
Y corrompióse la tierra delante de Dios, y estaba la tierra llena de violencia.
Y miró Dios la tierra, y he aquí que estaba corrompida; porque toda carne había corrompido su camino sobre la tierra.
Hazte un arca de madera de Gopher: harás aposentos en el arca, y la embetunarás con brea por dentro y por fuera.
Y de esta manera la harás: de trescientos codos la longitud del arca, de cincuenta codos su anchura, y de treinta codos su altura.
Y yo, he aquí que yo traigo un diluvio de aguas sobre la tierra, para destruir toda carne en que haya espíritu de vida debajo del cielo; todo lo que hay en la tierra morirá.
Mas estableceré mi pacto contigo, y entrarás en el arca tú, y tus hijos y tu mujer, y las mujeres de tus hijos contigo.
Y de todo lo que vive, de toda carne, dos de cada especie meterás en el arca, para que tengan vida contigo; macho y hembra serán.
De las aves según su especie, y de las bestias según su especie, de todo reptil de la tierra según su especie, dos de cada especie entrarán contigo para que hayan vida.
Y toma contigo de toda vianda que se come, y allégala á ti; servirá de alimento para ti y para ellos.
E hízolo así Noé; hizo conforme á todo lo que Dios le mandó.
Y JEHOVÁ dijo á Noé: Entra tú y toda tu casa en el arca; porque á ti he visto justo delante de mí en esta generación.
También de las aves de los cielos de siete en siete, macho y hembra; para guardar en vida la casta sobre la faz de toda la tierra.
Porquepasadosaún siete días, yo haré llover sobre la tierra cuarenta días y cuarenta noches; y raeré toda sustancia que hice de sobre la faz de la tierra.
E hizo Noé conforme á todo lo que le mandó Jehová.
Y siendo Noé de seiscientos años, el diluvio de las aguas fué sobre la tierra.
Y vino Noé, y sus hijos, y su mujer, y las mujeres de sus hijos con él al arca, por las aguas del diluvio.
De los animales limpios, y de los animales que no eran limpios, y de las aves, y de todo lo que anda arrastrando sobre la tierra,
De dos en dos entraron á Noé en el arca: macho y hembra, como mandó Dios á Noé.
Y sucedió que al séptimo día las aguas del diluvio fueron sobre la tierra.
El año seiscientos de la vida de Noé, en el mes segundo, á diecisiete días del mes, aquel día fueron rotas todas las fuentes del grande abismo, y las cataratas de los cielos fueron abiertas;
Y hubo lluvia sobre la tierra cuarenta días y cuarenta noches.
En este mismo día entró Noé, y Sem y Châm y Japhet, hijos de Noé, la mujer de Noé, y las tres mujeres de sus hijos con él en el arca;
Ellos, y todos los animalessilvestressegún sus especies, y todos los animales mansos según sus especies, y todo reptil que anda arrastrando sobre la tierra según su especie, y toda ave según su especie, todo pájaro, toda especie de volátil.
Y vinieron á Noé al arca, de dos en dos de toda carne en que había espíritu de vida.
Y los que vinieron, macho y hembra de toda carne vinieron, como le había mandado Dios: y Jehová le cerró la puerta.
Y fué el diluvio cuarenta días sobre la tierra; y las aguas crecieron, y alzaron el arca, y se elevó sobre la tierra.
Y prevalecieron las aguas, y crecieron en gran manera sobre la tierra; y andaba el arca sobre la faz de las aguas.
Y las aguas prevalecieron mucho en extremo sobre la tierra; y todos los montes altos que había debajo de todos los cielos, fueron cubiertos.
Quince codos en alto prevalecieron las aguas; y fueron cubiertos los montes.
Y murió toda carne que se mueve sobre la tierra, así de aves como de ganados, y de bestias, y de todo reptil que anda arrastrando sobre la tierra, y todo hombre:
Todo lo que tenía aliento de espíritu de vida en sus narices, de todo lo que había en la tierra, murió.
Así fué destruída toda sustancia que vivía sobre la faz de la tierra, desde el hombre hasta la bestia, y los reptiles, y las aves del cielo; y fueron raídos de la tierra; y quedó solamente Noé, y lo que con él estaba en el arca.
Y prevalecieron las aguas sobre la tierra ciento y cincuenta días.
Y ACORDÓSE Dios de Noé, y de todos los animales, y de todas las bestias que estaban con él en el arca; é hizo pasar Dios un viento sobre la tierra, y disminuyeron las aguas.
Y tornáronse las aguas de sobre la tierra, yendo y volviendo: y decrecieron las aguas al cabo de ciento y cincuenta días.
Y reposó el arca en el mes séptimo, á diecisiete días del mes, sobre los montes de Armenia.
Y las aguas fueron decreciendo hasta el mes décimo: en el décimo, al primero del mes, se descubrieron las cimas de los montes.
Y sucedió que, al cabo de cuarenta días, abrió Noé la ventana del arca que había hecho,
Y envió al cuervo, el cual salió, y estuvo yendo y tornando hasta que las aguas se secaron de sobre la tierra.
Envió también de sí á la paloma, para ver si las aguas se habían retirado de sobre la faz de la tierra;
Y no halló la paloma donde sentar la planta de su pie, y volvióse á él al arca, porque las aguas estaban aún sobre la faz de toda la tierra: entonces él extendió su mano, y cogiéndola, hízola entrar consigo en el arca.
Y esperó aún otros siete días, y volvió á enviar la paloma fuera del arca.
Y esperó aún otros siete días, y envió la paloma, la cual no volvió ya más á él.
Y en el mes segundo, á los veintisiete días del mes, se secó la tierra.
Y habló Dios á Noé diciendo:
Sal del arca tú, y tu mujer, y tus hijos, y las mujeres de tus hijos contigo.
Todos los animales que están contigo de toda carne, de aves y de bestias y de todo reptil que anda arrastrando sobre la tierra, sacarás contigo; y vayan por la tierra, y fructifiquen, y multiplíquense sobre la tierra.
Entonces salió Noé, y sus hijos, y su mujer, y las mujeres de sus hijos con él.
Y edificó Noé un altar á Jehová, y tomó de todo animal limpio y de toda ave limpia, y ofreció holocausto en el altar.
Y percibió Jehová olor de suavidad; y dijo Jehová en su corazón: No tornaré más á maldecir la tierra por causa del hombre; porque el intento del corazón del hombre es malo desde su juventud: ni volveré más á destruir todo viviente, como he hecho.
Todavía serán todos los tiempos de la tierra; la sementera y la siega, y el frío y calor, verano é invierno, y día y noche, no cesarán.
Y BENDIJO Dios á Noé y á sus hijos, y díjoles: Fructificad, y multiplicad, y henchid la tierra:
Y vuestro temor y vuestro pavor será sobre todo animal de la tierra, y sobre toda ave de los cielos, en todo lo que se moverá en la tierra, y en todos los peces del mar: en vuestra mano son entregados.
Todo lo que se mueve y vive, os será para mantenimiento: así como las legumbres y hierbas, os lo he dado todo.
Empero carne con su vida, que essu sangre, no comeréis.
Porque ciertamente demandaré la sangre de vuestras vidas; de mano de todo animal la demandaré, y de mano del hombre; de mano del varón su hermano demandaré la vida del hombre.
El que derramare sangre del hombre, por el hombre su sangre será derramada; porque á imagen de Dios es hecho el hombre.
Mas vosotros fructificad, y multiplicaos; procread abundantemente en la tierra, y multiplicaos en ella.
Y habló Dios á Noé y á sus hijos con él, diciendo:
Yo, he aquí que yo establezco mi pacto con vosotros, y con vuestra simiente después de vosotros;
Y con toda alma viviente que está con vosotros, de aves, de animales, y de toda bestia de la tierra que está con vosotros; desde todos los que salieron del arca hasta todo animal de la tierra.
Y dijo Dios: Esta será la señal del pacto que yo establezco entre mí y vosotros y toda alma viviente que está con vosotros, por siglos perpetuos:
Mi arco pondré en las nubes, el cual será por señal de convenio entre mí y la tierra.
Y será que cuando haré venir nubes sobre la tierra, se dejará ver entonces mi arco en las nubes.
Y acordarme he del pacto mío, que hay entre mí y vosotros y toda alma viviente de toda carne; y no serán más las aguas por diluvio para destruir toda carne.
Y estará el arco en las nubes, y verlo he para acordarme del pacto perpetuo entre Dios y toda alma viviente, con toda carne que hay sobre la tierra.
Dijo, pues, Dios á Noé: Esta será la señal del pacto que he establecido entre mí y toda carne que está sobre la tierra.
Y los hijos de Noé que salieron del arca fueron Sem, Châm y Japhet: y Châm es el padre de Canaán.
Y comenzó Noé á labrar la tierra, y plantó una viña:
Y bebió del vino, y se embriagó, y estaba descubierto en medio de su tienda.
Y Châm, padre de Canaán, vió la desnudez de su padre, y díjolo á sus dos hermanos á la parte de afuera.
Entonces Sem y Japhet tomaron la ropa, y la pusieron sobre sus propios hombros, y andando hacia atrás, cubrieron la desnudez de su padre, teniendo vueltos sus rostros, y así no vieron la desnudez de su padre.
Y despertó Noé de su vino, y supo lo que había hecho con él su hijo el más joven;
Y dijo: Maldito sea Canaán; siervo de siervos será á sus hermanos.
Dijo más: Bendito Jehová el Dios de Sem, y séale Canaán siervo.
Engrandezca Dios á Japhet, y habite en las tiendas de Sem, y séale Canaán siervo.
Y vivió Noé después del diluvio trescientos y cincuenta años.
Y fueron todos los días de Noé novecientos y cincuenta años; y murió.
ESTAS son las generaciones de los hijos de Noé: Sem, Châm y Japhet, á los cuales nacieron hijos después del diluvio.
Y los hijos de Gomer: Ashkenaz, y Riphat, y Togorma.
Y los hijos de Javán: Elisa, y Tarsis, Kittim, y Dodanim.
Por éstos fueron repartidas las islas de las gentes en sus tierras, cada cual según su lengua, conforme á sus familias en sus naciones.
Los hijos de Châm: Cush, y Mizraim, y Phut, y Canaán.
Y los hijos de Cush: Seba, Havila, y Sabta, y Raama, y Sabtecha. Y los hijos de Raama: Sheba y Dedán.
Y Cush engendró á Nimrod: éste comenzó á ser poderoso en la tierra.
Este fué vigoroso cazador delante de Jehová; por lo cual se dice: Así como Nimrod, vigoroso cazador delante de Jehová.
Y fué la cabecera de su reino Babel, y Erech, y Accad, y Calneh, en la tierra de Shinar.
De aquesta tierra salió Assur, y edificó á Nínive, y á Rehoboth, y á Calah,
Y á Ressen entre Nínive y Calah; la cual es ciudad grande.
Y Mizraim engendró á Ludim, y á Anamim, y á Lehabim, y á Naphtuhim,
Y á Pathrusim, y á Casluim, de donde salieron los Filisteos, y á Caphtorim.
Y Canaán engendró á Sidón, su primogénito, y á Heth,
Y al Jebuseo, y al Amorrheo, y al Gergeseo,
Y al Heveo, y al Araceo, y al Sineo,
Y al Aradio, y al Samareo, y al Amatheo: y después se derramaron las familias de los Cananeos.
Y fué el término de los Cananeos desde Sidón, viniendo á Gerar hasta Gaza, hasta entrar en Sodoma y Gomorra, Adma, y Zeboim hasta Lasa.
Estos son los hijos de Châm por sus familias, por sus lenguas, en sus tierras, en sus naciones.
También le nacieron hijos á Sem, padre de todos los hijos de Heber, y hermano mayor de Japhet.
Y los hijos de Sem: Elam, y Assur, y Arphaxad, y Lud, y Aram.
Y los hijos de Aram: Uz, y Hul, y Gether, y Mas.
Y Arphaxad engendró á Sala, y Sala engendró á Heber.
Y á Heber nacieron dos hijos: el nombre del uno fué Peleg, porque en sus días fué repartida la tierra; y el nombre de su hermano, Joctán.
Y Joctán engendró á Almodad, y á Sheleph, y Hazarmaveth, y á Jera,
Y á Hadoram, y á Uzal, y á Dicla,
Y á Obal, y á Abimael, y á Seba,
Y á Ophir, y á Havila, y á Jobad: todos estos fueron hijos de Joctán.
Y fué su habitación desde Mesa viniendo de Sephar, monte á la parte del oriente.
Estos fueron los hijos de Sem por sus familias, por sus lenguas, en sus tierras, en sus naciones.
Estas son las familias de Noé por sus descendencias, en sus naciones; y de éstos fueron divididas las gentes en la tierra después del diluvio.
ERA entonces toda la tierra de una lengua y unas mismas palabras.
Y aconteció que, como se partieron de oriente, hallaron una vega en la tierra de Shinar, y asentaron allí.
Y dijeron los unos á los otros: Vaya, hagamos ladrillo y cozámoslo con fuego. Y fuéles el ladrillo en lugar de piedra, y el betún en lugar de mezcla.
Y dijeron: Vamos, edifiquémonos una ciudad y una torre, cuya cúspide llegue al cielo; y hagámonos un nombre, por si fuéremos esparcidos sobre la faz de toda la tierra.
Y descendió Jehová para ver la ciudad y la torre que edificaban los hijos de los hombres.
Y dijo Jehová: He aquí el pueblo es uno, y todos éstos tienen un lenguaje: y han comenzado á obrar, y nada les retraerá ahora de lo que han pensando hacer.
Ahora pues, descendamos, y confundamos allí sus lenguas, para que ninguno entienda el habla de su compañero.
Así los esparció Jehová desde allí sobre la faz de toda la tierra, y dejaron de edificar la ciudad.
Por esto fué llamado el nombre de ella Babel, porque allí confundió Jehová el lenguaje de toda la tierra, y desde allí los esparció sobre la faz de toda la tierra.
Y vivió Sem, después que engendró á Arphaxad, quinientos años, y engendró hijos é hijas.
Y Arphaxad vivió treinta y cinco años, y engendró á Sala.
Y vivió Arphaxad, después que engendró á Sala, cuatrocientos y tres años, y engendró hijos é hijas.
Y vivió Sala treinta años, y engendró á Heber.
Y vivió Sala, después que engendró á Heber, cuatrocientos y tres años, y engendró hijos é hijas.
Y vivió Heber treinta y cuatro años, y engendró á Peleg.
Y vivió Heber, después que engendró á Peleg, cuatrocientos y treinta años, y engendró hijos é hijas.
Y vivió Peleg treinta años, y engendró á Reu.
Y vivió Peleg, después que engendró á Reu, doscientos y nueve años, y engendró hijos é hijas.
Y Reu vivió treinta y dos años, y engendró á Serug.
Y vivió Reu, después que engendró á Serug, doscientos y siete años, y engendró hijos é hijas.
Y vivió Serug treinta años, y engendró á Nachôr.
Y vivió Serug, después que engendró á Nachôr, doscientos años, y engendró hijos é hijas.
Y vivió Nachôr veintinueve años, y engendró á Thare.
Y vivió Nachôr, después que engendró á Thare, ciento diecinueve años, y engendró hijos é hijas.
Y vivió Thare setenta años, y engendró á Abram, y á Nachôr, y á Harán.
Estas son las generaciones de Thare: Thare engendró á Abram, y á Nachôr, y á Harán; y Harán engendró á Lot.
Y murió Harán antes que su padre Thare en la tierra de su naturaleza, en Ur de los Caldeos.
Y tomaron Abram y Nachôr para sí mujeres: el nombre de la mujer de Abram fué Sarai, y el nombre de la mujer de Nachôr, Milca, hija de Harán, padre de Milca y de Isca.
Mas Sarai fué estéril, y no tenía hijo.
Y tomó Thare á Abram su hijo, y á Lot hijo de Harán, hijo de su hijo, y á Sarai su nuera, mujer de Abram su hijo: y salió con ellos de Ur de los Caldeos, para ir á la tierra de Canaán: y vinieron hasta Harán, y asentaron allí.
Y fueron los días de Thare doscientos y cinco años; y murió Thare en Harán.
EMPERO Jehová había dicho á Abram: Vete de tu tierra y de tu parentela, y de la casa de tu padre, á la tierra que te mostraré;
Y haré de ti una nación grande, y bendecirte he, y engrandeceré tu nombre, y serás bendición:
Y bendeciré á los que te bendijeren, y á los que te maldijeren maldeciré: y serán benditas en ti todas las familias de la tierra.
Y fuése Abram, como Jehová le dijo; y fué con él Lot: y era Abram de edad de setenta y cinco años cuando salió de Harán.
Y tomó Abram á Sarai su mujer, y á Lot hijo de su hermano, y toda su hacienda que habían ganado, y las almas que habían adquirido en Harán, y salieron para ir á tierra de Canaán; y á tierra de Canaán llegaron.
Y pasó Abram por aquella tierra hasta el lugar de Sichêm, hasta el valle de Moreh: y el Cananeo estaba entonces en la tierra.
Y apareció Jehová á Abram, y le dijo: A tu simiente daré esta tierra. Y edificó allí un altar á Jehová, que le había aparecido.
Y pasóse de allí á un monte al oriente de Bethel, y tendió su tienda, teniendo á Bethel al occidente y Hai al oriente: y edificó allí altar á Jehová, é invocó el nombre de Jehová.
Y movió Abramde allí, caminando y yendo hacia el Mediodía.
Y hubo hambre en la tierra, y descendió Abram á Egipto para peregrinar allá; porque era grande el hambre en la tierra.
Y aconteció que cuando estaba para entrar en Egipto, dijo á Sarai su mujer: He aquí, ahora conozco que eres mujer hermosa de vista;
Y será que cuando te habrán visto los Egipcios, dirán: Su mujer es: y me matarán á mí, y á ti te reservarán la vida.
Ahora pues, di que eres mi hermana, para que yo haya bien por causa tuya, y viva mi alma por amor de ti.
Y aconteció que, como entró Abram en Egipto, los Egipcios vieron la mujer que era hermosa en gran manera.
Viéronla también los príncipes de Faraón, y se la alabaron; y fué llevada la mujer á casa de Faraón:
E hizo bien á Abram por causa de ella; y tuvo ovejas, y vacas, y asnos, y siervos, y criadas, y asnas y camellos.
Mas Jehová hirió á Faraón y á su casa con grandes plagas, por causa de Sarai mujer de Abram.
¿Por qué dijiste: Es mi hermana? poniéndome en ocasión de tomarla para mí por mujer? Ahora pues, he aquí tu mujer, tómala y vete.
Entonces Faraón dió orden á sus gentes acerca de Abram; y le acompañaron, y á su mujer con todo lo que tenía.
Y Abram era riquísimo en ganado, en plata y oro.
Y volvió por sus jornadas de la parte del Mediodía hacia Bethel, hasta el lugar donde había estado antes su tienda entre Bethel y Hai;
Al lugar del altar que había hecho allí antes: é invocó allí Abram el nombre de Jehová.
Y asimismo Lot, que andaba con Abram, tenía ovejas, y vacas, y tiendas.
Y la tierra no podía darles para que habitasen juntos: porque su hacienda era mucha, y no podían morar en un mismo lugar.
Y hubo contienda entre los pastores del ganado de Abram y los pastores del ganado de Lot: y el Cananeo y el Pherezeo habitaban entonces en la tierra.
¿No está toda la tierra delante de ti? Yo te ruego que te apartes de mí. Si fueres á la mano izquierda, yo iré á la derecha: y si tú á la derecha, yo iré á la izquierda.
Y alzó Lot sus ojos, y vió toda la llanura del Jordán, que toda ella era de riego, antes que destruyese Jehová á Sodoma y á Gomorra, como el huerto de Jehová, como la tierra de Egipto entrando en Zoar.
Entonces Lot escogió para sí toda la llanura del Jordán: y partióse Lot de Oriente, y apartáronse el uno del otro.
Abram asentó en la tierra de Canaán, y Lot asentó en las ciudades de la llanura, y fué poniendo sus tiendas hasta Sodoma.
Mas los hombres de Sodoma eran malos y pecadores para con Jehová en gran manera.
Porque toda la tierra que ves, la daré á ti y á tu simiente para siempre.
Y haré tu simiente como el polvo de la tierra: que si alguno podrá contar el polvo de la tierra, también tu simiente será contada.
Levántate, ve por la tierra á lo largo de ella y á su ancho; porque á ti la tengo de dar.
Abram, pues, removiendo su tienda, vino y moró en el alcornocal de Mamre, que es en Hebrón, y edificó allí altar á Jehová.
Y ACONTECIÓ en los días de Amraphel, rey de Shinar, Arioch, rey de Elazar, Chêdorlaomer, rey de Elá, y Tidal, rey de naciones,
Que éstos hicieron guerra contra Bera, rey de Sodoma, y contra Birsha, rey de Gomorra, y contra Shinab, rey de Adma, y contra Shemeber, rey de Zeboim, y contra el rey de Bela, la cual es Zoar.
Todos estos se juntaron en el valle de Siddim, que es el mar salado.
Doce años habían servido á Chêdorlaomer, y al décimotercio año se rebelaron.
Y en el año décimocuarto vino Chêdorlaomer, y los reyes que estaban de su parte, y derrotaron á los Raphaitas en Ashteroth-carnaim, á los Zuzitas en Ham, y á los Emitas en Shave-Kiriataim.
Y á los Horeos en el monte de Seir, hasta la llanura de Parán, que está junto al desierto.
Y volvieron, y vinieron á Emmisphat, que es Cades, y devastaron todas las haciendas de los Amalecitas, y también al Amorrheo, que habitaba en Hazezón-tamar.
Y salió el rey de Sodoma, y el rey de Gomorra, y el rey de Adma, y el rey de Zeboim, y el rey de Bela, que es Zoar, y ordenaron contra ellos batalla en el valle de Siddim;
Es á saber, contra Chêdorlaomer, rey de Elam, y Tidal, rey de naciones, y Amraphel, rey de Shinar, y Arioch, rey de Elasar; cuatro reyes contra cinco.
Y el valle de Siddim estaba lleno de pozos de betún: y huyeron el rey de Sodoma y el de Gomorra, y cayeron allí; y los demás huyeron al monte.
Tomaron también á Lot, hijo del hermano de Abram, que moraba en Sodoma, y su hacienda, y se fueron.
Y vino uno de los que escaparon, y denunciólo á Abram el Hebreo, que habitaba en el valle de Mamre Amorrheo, hermano de Eschôl y hermano de Aner, los cuales estaban confederados con Abram.
Y oyó Abram que su hermano estaba prisionero, y armó sus criados, los criados de su casa, trescientos dieciocho, y siguiólos hasta Dan.
Y derramóse sobre ellos de noche él y sus siervos, é hiriólos, y fuélos siguiendo hasta Hobah, que está á la izquierda de Damasco.
Y recobró todos los bienes, y también á Lot su hermano y su hacienda, y también las mujeres y gente.
Y salió el rey de Sodoma á recibirlo, cuando volvía de la derrota de Chêdorlaomer y de los reyes que con él estaban, al valle de Shave, que es el valle del Rey.
Entonces Melchîsedec, rey de Salem, sacó pan y vino; el cual era sacerdote del Dios alto;
Y bendíjole, y dijo: Bendito sea Abram del Dios alto, poseedor de los cielos y de la tierra;
Y bendito sea el Dios alto, que entregó tus enemigos en tu mano. Y dióle Abram los diezmos de todo.
Entonces el rey de Sodoma dijo á Abram: Dame las personas, y toma para ti la hacienda.
Y respondió Abram al rey de Sodoma: He alzado mi mano á Jehová Dios alto, poseedor de los cielos y de la tierra,
Que desde un hilo hasta la correa de un calzado, nada tomaré de todo lo que es tuyo, porque no digas: Yo enriquecí á Abram:
Sacando solamente lo que comieron los mancebos, y la porción de los varones que fueron conmigo, Aner, Eschôl, y Mamre; los cuales tomarán su parte.
DESPUÉS de estas cosas fué la palabra de Jehová á Abram en visión, diciendo: No temas, Abram; yo soy tu escudo, ytu galardón sobremanera grande.
Y respondió Abram: Señor Jehová ¿qué me has de dar, siendo así que ando sin hijo, y el mayordomo de mi casa es ese Damasceno Eliezer?
Dijo más Abram: Mira que no me has dado prole, y he aquí que es mi heredero uno nacido en mi casa.
Y luego la palabra de Jehová fué á él diciendo: No te heredará éste, sino el que saldrá de tus entrañas será el que te herede.
Y sacóle fuera, y dijo: Mira ahora á los cielos, y cuenta las estrellas, si las puedes contar. Y le dijo: Así será tu simiente.
Y creyó á Jehová, y contóselo por justicia.
Y díjole: Yo soy Jehová, que te saqué de Ur de los Caldeos, para darte á heredar esta tierra.
Y él respondió: Señor Jehová, ¿en qué conoceré que la tengo de heredar?
Y le dijo: Apártame una becerra de tres años, y una cabra de tres años, y un carnero de tres años, una tórtola también, y un palomino.
Y tomó él todas estas cosas, y partiólas por la mitad, y puso cada mitad una enfrente de otra; mas no partió las aves.
Y descendían aves sobre los cuerpos muertos, y ojeábalas Abram.
Mas á la caída del sol sobrecogió el sueño á Abram, y he aquí que el pavor de una grande obscuridad cayó sobre él.
Entonces dijo á Abram: Ten por cierto que tu simiente será peregrina en tierra no suya, y servirá á los de allí, y serán por ellos afligidos cuatrocientos años.
Mas también á la gente á quien servirán, juzgaré yo; y después de esto saldrán con grande riqueza.
Y tú vendrás á tus padres en paz, y serás sepultado en buena vejez.
Y en la cuarta generación volverán acá: porque aun no está cumplida la maldad del Amorrheo hasta aquí.
Y sucedió que puesto el sol, y ya obscurecido, dejóse ver un horno humeando, y una antorcha de fuego que pasó por entre los animales divididos.
En aquel día hizo Jehová un pacto con Abram diciendo: A tu simiente daré esta tierra desde el río de Egipto hasta el río grande, el río Eufrates;
Los Cineos, y los Ceneceos, y los Cedmoneos,
Y los Hetheos, y los Pherezeos, y los Raphaitas,
Y los Amorrheos, y los Cananeos, y los Gergeseos, y los Jebuseos.
Y SARAI, mujer de Abram, no le paría: y ella tenía una sierva egipcia, que se llamaba Agar.
Dijo, pues, Sarai á Abram: Ya ves que Jehová me ha hecho estéril: ruégote que entres á mi sierva; quizá tendré hijos de ella. Y atendió Abram al dicho de Sarai.
Y Sarai, mujer de Abram, tomó á Agar su sierva egipcia, al cabo de diez años que había habitado Abram en la tierra de Canaán, y dióla á Abram su marido por mujer.
Y él cohabitó con Agar, la cual concibió: y cuando vió que había concebido, miraba con desprecio á su señora.
Entonces Sarai dijo á Abram: Mi afrenta sea sobre ti: yo puse mi sierva en tu seno, y viéndose embarazada, me mira con desprecio; juzgue Jehová entre mí y ti.
Y respondió Abram á Sarai: He ahí tu sierva en tu mano, haz con ella lo que bien te pareciere. Y como Sarai la afligiese, huyóse de su presencia.
Y hallóla el ángel de Jehová junto á una fuente de agua en el desierto, junto á la fuente que está en el camino del Sur.
Y le dijo: Agar, sierva de Sarai, ¿de dónde vienes tú, y á dónde vas? Y ella respondió: Huyo de delante de Sarai, mi señora.
Y díjole el ángel de Jehová: Vuélvete á tu señora, y ponte sumisa bajo de su mano.
Díjole también el ángel de Jehová: Multiplicaré tanto tu linaje, que no será contado á causa de la muchedumbre.
Díjole aún el ángel de Jehová: He aquí que has concebido, y parirás un hijo, y llamarás su nombre Ismael, porque oído ha Jehová tu aflicción.
Y él será hombre fiero; su mano contra todos, y las manos de todos contra él, y delante de todos sus hermanos habitará.
Entonces llamó el nombre de Jehová que con ella hablaba: Tú eres el Dios de la vista; porque dijo: ¿No he visto también aquí al que me ve?
Por lo cual llamó al pozo, Pozo del Viviente que me ve. He aquí está entre Cades y Bered.
Y parió Agar á Abram un hijo, y llamó Abram el nombre de su hijo que le parió Agar, Ismael.
Y era Abram de edad de ochenta y seis años, cuando parió Agar á Ismael.
Y SIENDO Abram de edad de noventa y nueve años, aparecióle Jehová, y le dijo: Yo soy el Dios Todopoderoso; anda delante de mí, y sé perfecto.
Y pondré mi pacto entre mí y ti, y multiplicarte he mucho en gran manera.
Entonces Abram cayó sobre su rostro, y Dios habló con él diciendo:
Yo, he aquí mi pacto contigo: Serás padre de muchedumbre de gentes:
Y no se llamará más tu nombre Abram, sino que será tu nombre Abraham, porque te he puesto por padre de muchedumbre de gentes.
Y multiplicarte he mucho en gran manera, y te pondré en gentes, y reyes saldrán de ti.
Y estableceré mi pacto entre mí y ti, y tu simiente después de ti en sus generaciones, por alianza perpetua, para serte á ti por Dios, y á tu simiente después de ti.
Y te daré á ti, y á tu simiente después de ti, la tierra de tus peregrinaciones, toda la tierra de Canaán en heredad perpetua; y seré el Dios de ellos.
Dijo de nuevo Dios á Abraham: Tú empero guardarás mi pacto, tú y tu simiente después de ti por sus generaciones.
Este será mi pacto, que guardaréis entre mí y vosotros y tu simiente después de ti: Será circuncidado todo varón de entre vosotros.
Circuncidaréis, pues, la carne de vuestro prepucio, y será por señal del pacto entre mí y vosotros.
Y de edad de ocho días será circuncidado todo varón entre vosotros por vuestras generaciones: el nacido en casa, y el comprado á dinero de cualquier extranjero, que no fuere de tu simiente.
Debe ser circuncidado el nacido en tu casa, y el comprado por tu dinero: y estará mi pacto en vuestra carne para alianza perpetua.
Y el varón incircunciso que no hubiere circuncidado la carne de su prepucio, aquella persona será borrada de su pueblo; ha violado mi pacto.
Dijo también Dios á Abraham: A Sarai tu mujer no la llamarás Sarai, mas Sara será su nombre.
Y bendecirla he, y también te daré de ella hijo; sí, la bendeciré, y vendrá á ser madre de naciones; reyes de pueblos serán de ella.
Entonces Abraham cayó sobre su rostro, y rióse, y dijo en su corazón: ¿A hombre de cien años ha de nacer hijo? ¿y Sara, ya de noventa años, ha de parir?
Y dijo Abraham á Dios: Ojalá Ismael viva delante de ti.
Y respondió Dios: Ciertamente Sara tu mujer te parirá un hijo, y llamarás su nombre Isaac; y confirmaré mi pacto con él por alianza perpetua para su simiente después de él.
Y en cuanto á Ismael, también te he oído: he aquí que le bendeciré, y le haré fructificar y multiplicar mucho en gran manera: doce príncipes engendrará, y ponerlo he por gran gente.
Mas yo estableceré mi pacto con Isaac, al cual te parirá Sara por este tiempo el año siguiente.
Y acabó de hablar con él, y subió Dios de con Abraham.
Entonces tomó Abraham á Ismael su hijo, y á todos los siervos nacidos en su casa, y á todos los comprados por su dinero, á todo varón entre los domésticos de la casa de Abraham, y circuncidó la carne del prepucio de ellos en aquel mismo día, como Dios le había dicho.
Era Abraham de edad de noventa y nueve años cuando circuncidó la carne de su prepucio.
E Ismael su hijo era de trece años, cuando fué circuncidada la carne de su prepucio.
En el mismo día fué circuncidado Abraham é Ismael su hijo.
Y todos los varones de su casa, el siervo nacido en casa, y el comprado por dinero del extranjero, fueron circuncidados con él.
